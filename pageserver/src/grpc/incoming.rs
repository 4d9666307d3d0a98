//! The page service's connections, under the server's connection cap ([`ConnectionLimit`],
//! shared with the HTTP server): a connection takes a place when it is accepted and gives it
//! back when it closes. While the cap is reached, one accepted connection waits for a place and
//! the others wait in the kernel's listen queue, costing no descriptor. The page service may
//! hold all places but a floor kept for HTTP ([`ConnectionLimit::http_floor`]): its
//! connections are long-lived and may sit idle, and must never lock the HTTP API out. A
//! connection that does not finish its HTTP/2 handshake in time gives its place back
//! ([`HandshakeDeadline`]). Each connection carries the budget its streams' answers share
//! ([`super::budget::ConnectionInfo`]).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::Stream;
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::Connected;

use super::budget::{AnswerLimits, ByteBudget, ConnectionInfo};
use super::handshake::HandshakeDeadline;
use crate::serving::connections::{accept_error, Admitted, ConnectionLimit};
use crate::serving::socket::{delegate_async_read, delegate_async_write};

/// An accepted connection holding its place under the cap.
pub struct CappedConnection {
    stream: HandshakeDeadline<TcpStream>,
    _admitted: Admitted,
    answers: Arc<ByteBudget>,
}

/// The connections `listener` accepts, each once a place under `limit` is free, each with
/// `handshake_timeout` from then to send its HTTP/2 handshake and a budget of `answer_limits`
/// for its answers.
pub fn incoming(
    listener: TcpListener,
    limit: Arc<ConnectionLimit>,
    handshake_timeout: Duration,
    answer_limits: AnswerLimits,
) -> impl Stream<Item = io::Result<CappedConnection>> {
    futures::stream::unfold((listener, limit), move |(listener, limit)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    // Accepted first, then it waits for a place: an idle page service holds
                    // no place that HTTP connections could use, and while the cap is reached
                    // one accepted connection waits here, the rest in the listen queue.
                    let admitted = limit.admit_page_service().await;
                    // Answers are small frames as often as large ones: no Nagle delay.
                    let _ = stream.set_nodelay(true);
                    let connection = CappedConnection {
                        stream: HandshakeDeadline::new(stream, handshake_timeout),
                        _admitted: admitted,
                        answers: answer_limits.for_new_connection(),
                    };
                    return Some((Ok(connection), (listener, limit)));
                }
                Err(e) => accept_error(e).await,
            }
        }
    })
}

impl Connected for CappedConnection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            tcp: self.stream.get_ref().connect_info(),
            answers: self.answers.clone(),
        }
    }
}

delegate_async_read!([] CappedConnection, stream);
delegate_async_write!([] CappedConnection, stream);
