//! `pagectl getpage`: pages read through the page service (gRPC), as compute reads them, with
//! nothing but pagectl: a check that the page service answers, and what it answers.
//!
//! Every key is read at every LSN given, all in one `GetPages` batch on one stream (at most
//! the protocol's 1,024 pages). A batch says per page whether the key had a version at or below
//! the LSN (`found`), so a page that does not exist is an answer, printed as such, while a
//! timeline that does not exist, a refused token or a failed batch is an error (exit code 1).
//! One line per page, in the order asked: key, the LSN asked for, then the page's length and
//! CRC-32C (the fingerprint `pagectl layer values` prints too) and the LSN it was read at; then
//! the batch's read cost, in the form of the HTTP API's `X-Read-Cost`.

use std::io::Write;

use anyhow::{anyhow, Context};
use bytes::Bytes;
use clap::Args;
use page_api::proto::page_service_client::PageServiceClient;
use page_api::proto::{GetPagesRequest, PageRef, ReadCost};
use page_api::{TENANT_ID_HEADER, TIMELINE_ID_HEADER};
use pageserver_api::Key;
use tonic::metadata::MetadataValue;
use utils::Lsn;

use crate::server::{Endpoint, ReadLsn, TimelineArgs};

/// The largest answer accepted: a full batch of 8 KiB pages with room to spare.
const MAX_ANSWER: usize = 64 << 20;
/// How long connecting may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Args)]
pub struct GetPageArgs {
    /// The page service (gRPC).
    #[arg(long, default_value = "http://127.0.0.1:9899", value_name = "URL")]
    grpc_endpoint: Endpoint,
    #[command(flatten)]
    target: TimelineArgs,
    /// A page's key (36 hex digits); repeat it for more pages.
    #[arg(long = "key", value_name = "KEY", required = true)]
    keys: Vec<Key>,
    /// The LSN to read at, `X/X` or `latest`; repeat it to read every key at each.
    #[arg(long = "lsn", value_name = "LSN", default_value = "latest")]
    lsns: Vec<ReadLsn>,
    /// Also hex-dump each page found.
    #[arg(long)]
    raw: bool,
    /// Bytes of each page the hex dump shows.
    #[arg(long, default_value_t = 64, value_name = "BYTES", requires = "raw")]
    raw_bytes: usize,
}

impl GetPageArgs {
    /// The pages asked for, in order; an error (a usage error) past the protocol's batch size.
    pub fn pages(&self) -> Result<Vec<(Key, ReadLsn)>, String> {
        let count = self.keys.len() * self.lsns.len();
        if count > page_api::MAX_BATCH_PAGES {
            return Err(format!(
                "{} keys at {} LSNs are {count} pages; one batch holds at most {}",
                self.keys.len(),
                self.lsns.len(),
                page_api::MAX_BATCH_PAGES
            ));
        }
        Ok(self
            .keys
            .iter()
            .flat_map(|&key| self.lsns.iter().map(move |&lsn| (key, lsn)))
            .collect())
    }
}

fn wire_lsn(lsn: ReadLsn) -> u64 {
    match lsn {
        ReadLsn::Latest => 0,
        ReadLsn::At(lsn) => lsn.0,
    }
}

/// `X-Read-Cost`'s form of a read cost.
fn cost_text(c: &ReadCost) -> String {
    format!(
        "layers={} idx_hit={} idx_miss={} val_hit={} val_miss={} ios={} bytes={} waits={} downloads={}",
        c.layers, c.idx_hit, c.idx_miss, c.val_hit, c.val_miss, c.ios, c.bytes, c.waits, c.downloads
    )
}

pub fn getpage(args: GetPageArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let pages = args.pages().map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let endpoint = args.grpc_endpoint.to_string();
    let answer = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.clone())
            .with_context(|| format!("--grpc-endpoint {endpoint}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .connect()
            .await
            .with_context(|| format!("connecting to {endpoint}"))?;
        let mut client = PageServiceClient::new(channel).max_decoding_message_size(MAX_ANSWER);
        let batch = GetPagesRequest {
            id: 1,
            pages: pages
                .iter()
                .map(|(key, lsn)| PageRef {
                    key: Bytes::copy_from_slice(&key.to_bytes()),
                    lsn: wire_lsn(*lsn),
                })
                .collect(),
        };
        let mut request = tonic::Request::new(futures::stream::iter([batch]));
        let metadata = request.metadata_mut();
        metadata.insert(
            TENANT_ID_HEADER,
            MetadataValue::try_from(args.target.tenant.to_string())?,
        );
        metadata.insert(
            TIMELINE_ID_HEADER,
            MetadataValue::try_from(args.target.timeline.to_string())?,
        );
        if let Some(token) = args.target.token() {
            let value = MetadataValue::try_from(format!("Bearer {token}"))
                .map_err(|_| anyhow!("the token is not valid in a gRPC header"))?;
            metadata.insert("authorization", value);
        }
        let refused =
            |s: tonic::Status| anyhow!("the page service answered {:?}: {}", s.code(), s.message());
        let mut answers = client
            .get_pages(request)
            .await
            .map_err(refused)?
            .into_inner();
        answers
            .message()
            .await
            .map_err(refused)?
            .ok_or_else(|| anyhow!("the page service ended the stream without an answer"))
    })?;
    if let Some(e) = &answer.error {
        return Err(anyhow!(
            "the batch failed: {} (gRPC code {})",
            e.message,
            e.code
        ));
    }
    if answer.pages.len() != pages.len() {
        return Err(anyhow!(
            "the page service answered {} pages for the {} asked",
            answer.pages.len(),
            pages.len()
        ));
    }
    for ((key, asked), page) in pages.iter().zip(&answer.pages) {
        let read_at = Lsn(page.lsn);
        if page.found {
            writeln!(
                out,
                "{key} {asked} page len={} crc={:#010x} read_at={read_at}",
                page.page.len(),
                utils::crc32c::crc32c(&page.page)
            )?;
            if args.raw {
                super::hex_dump(&page.page, args.raw_bytes, out)?;
            }
        } else {
            writeln!(out, "{key} {asked} not found read_at={read_at}")?;
        }
    }
    let cost = answer.cost.unwrap_or_default();
    writeln!(out, "cost {}", cost_text(&cost))?;
    Ok(())
}
