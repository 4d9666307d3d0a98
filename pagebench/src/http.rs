//! The HTTP client: one keep-alive HTTP/1.1 connection per client, driven by hand, and the
//! management calls the commands make.

use super::*;

/// Where the server is and what to authenticate with.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// `host:port` as given, for the `Host` header.
    pub(crate) authority: String,
    pub(crate) authorization: Option<HeaderValue>,
}

impl Endpoint {
    pub(crate) fn parse(url: &str, token: Option<String>) -> anyhow::Result<Endpoint> {
        let uri: hyper::Uri = url
            .parse()
            .with_context(|| format!("invalid endpoint `{url}`"))?;
        if uri.scheme_str() != Some("http") {
            bail!("endpoint `{url}`: only http:// is supported");
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            bail!("endpoint `{url}`: expected http://host:port, without a path");
        }
        let authority = uri
            .authority()
            .with_context(|| format!("endpoint `{url}` has no host"))?;
        let authorization = token
            .map(|t| HeaderValue::try_from(format!("Bearer {t}")))
            .transpose()
            .context("the token is not a valid header value")?;
        Ok(Endpoint {
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: authority.port_u16().unwrap_or(80),
            authority: authority.as_str().to_owned(),
            authorization,
        })
    }
}

/// One keep-alive HTTP/1.1 connection, opened on first use and again after it breaks.
pub(crate) struct Connection {
    pub(crate) endpoint: Arc<Endpoint>,
    pub(crate) sender: Option<SendRequest<Full<Bytes>>>,
    /// Connections opened so far; more than one means some were closed or broke.
    pub(crate) opened: u64,
}

impl Connection {
    pub(crate) fn new(endpoint: Arc<Endpoint>) -> Connection {
        Connection {
            endpoint,
            sender: None,
            opened: 0,
        }
    }

    /// One exchange: the response's status and its whole body. After a failure the connection
    /// is dropped and the next exchange opens a new one.
    pub(crate) async fn exchange(
        &mut self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let (status, _, body) = self.exchange_with_headers(method, path, body).await?;
        Ok((status, body))
    }

    /// [`Connection::exchange`], with the response's headers.
    pub(crate) async fn exchange_with_headers(
        &mut self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> anyhow::Result<(StatusCode, HeaderMap, Bytes)> {
        let result = self.exchange_inner(method.clone(), path, body).await;
        if result.is_err() {
            self.sender = None;
        }
        result.with_context(|| format!("{method} {path}"))
    }

    pub(crate) async fn exchange_inner(
        &mut self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
    ) -> anyhow::Result<(StatusCode, HeaderMap, Bytes)> {
        if self.sender.as_ref().is_none_or(SendRequest::is_closed) {
            self.sender = Some(open(&self.endpoint).await?);
            self.opened += 1;
        }
        let sender = self.sender.as_mut().expect("opened above");
        sender.ready().await.context("the connection broke")?;
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, &self.endpoint.authority);
        if let Some(authorization) = &self.endpoint.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        let body = match body {
            Some((bytes, content_type)) => {
                request = request.header(CONTENT_TYPE, content_type);
                bytes
            }
            None => Bytes::new(),
        };
        let response = sender.send_request(request.body(Full::new(body))?).await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .context("reading the response body")?
            .to_bytes();
        Ok((status, headers, body))
    }

    /// A management call: the `expect`ed status and a JSON response, or an error carrying the
    /// server's message.
    pub(crate) async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Option<JsonValue>,
        expect: StatusCode,
    ) -> anyhow::Result<JsonValue> {
        let body = body.map(|json| (Bytes::from(json.to_string()), JSON_TYPE));
        let (status, bytes) = self.exchange(method.clone(), path, body).await?;
        if status != expect {
            bail!("{method} {path}: {}", describe_failure(status, &bytes));
        }
        serde_json::from_slice(&bytes)
            .with_context(|| format!("{method} {path}: the response is not JSON"))
    }

    pub(crate) async fn create_tenant(&mut self) -> anyhow::Result<TenantId> {
        let info = self
            .call(
                Method::POST,
                "/v1/tenant",
                Some(json!({})),
                StatusCode::CREATED,
            )
            .await?;
        parse_field(&info, "id")
    }

    /// A new timeline and its `last_record_lsn`.
    pub(crate) async fn create_timeline(
        &mut self,
        tenant: TenantId,
    ) -> anyhow::Result<(TimelineId, Lsn)> {
        let path = format!("/v1/tenant/{tenant}/timeline");
        let info = self
            .call(Method::POST, &path, Some(json!({})), StatusCode::CREATED)
            .await?;
        Ok((
            parse_field(&info, "timeline_id")?,
            parse_field(&info, "last_record_lsn")?,
        ))
    }

    pub(crate) async fn last_record_lsn(&mut self, timeline_path: &str) -> anyhow::Result<Lsn> {
        let info = self
            .call(Method::GET, timeline_path, None, StatusCode::OK)
            .await?;
        parse_field(&info, "last_record_lsn")
    }
}

pub(crate) async fn open(endpoint: &Endpoint) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .with_context(|| format!("connecting to {}", endpoint.authority))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // A connection's own error surfaces in the exchange that was using it.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// `status: message` of a failed response, the message from the server's `{"msg": ...}`.
pub(crate) fn describe_failure(status: StatusCode, body: &[u8]) -> String {
    let msg = serde_json::from_slice::<JsonValue>(body)
        .ok()
        .and_then(|v| v.get("msg")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    format!("{status}: {msg}")
}

/// A string field of a JSON response, parsed.
pub(crate) fn parse_field<T>(json: &JsonValue, name: &str) -> anyhow::Result<T>
where
    T: FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let text = json
        .get(name)
        .and_then(JsonValue::as_str)
        .with_context(|| format!("the response has no string field `{name}`: {json}"))?;
    text.parse()
        .with_context(|| format!("field `{name}` of the response"))
}

pub(crate) fn timeline_path(tenant: TenantId, timeline: TimelineId) -> String {
    format!("/v1/tenant/{tenant}/timeline/{timeline}")
}

/// Polls `GET /v1/status` until the server answers, for at most `timeout` (a server that was
/// just started).
pub(crate) async fn wait_until_answering(
    endpoint: &Arc<Endpoint>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut conn = Connection::new(endpoint.clone());
    while conn
        .call(Method::GET, "/v1/status", None, StatusCode::OK)
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            bail!("the server did not answer within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
