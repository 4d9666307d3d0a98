//! The ingest body decoder: never panics, and decoding the body in chunks cut anywhere gives
//! exactly what decoding it whole gives (the same records or the same error). Records that
//! decode encode back to records that decode the same.

use bytes::Bytes;
use pageserver_api::ingest::{decode_batch, encode_batch, BatchDecoder};

/// Checks one input; panics where the decoder breaks its contract.
pub fn check(input: &[u8]) {
    // The first byte sets the largest payload, the second how many cuts follow, each cut two
    // bytes (a position in the body, modulo its length); the rest is the body.
    let [max, cuts, rest @ ..] = input else {
        return;
    };
    let cut_bytes = (usize::from(*cuts) * 2).min(rest.len());
    let (cuts, body) = rest.split_at(cut_bytes);
    let max_payload = usize::from(*max) * 64;
    let body = Bytes::copy_from_slice(body);
    let whole = decode_batch(body.clone(), max_payload);

    let mut at: Vec<usize> = cuts
        .chunks_exact(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (body.len() + 1))
        .collect();
    at.push(0);
    at.push(body.len());
    at.sort_unstable();
    let mut decoder = BatchDecoder::new(max_payload);
    let mut fed = Ok(());
    for pair in at.windows(2) {
        fed = decoder.feed(body.slice(pair[0]..pair[1]));
        if fed.is_err() {
            break;
        }
    }
    let chunked = fed.and_then(|()| decoder.finish());
    assert_eq!(
        chunked, whole,
        "chunked decoding differs from whole decoding"
    );

    if let Ok(records) = whole {
        let again = encode_batch(&records).expect("decoded records encode");
        assert_eq!(
            decode_batch(Bytes::from(again), max_payload).as_ref(),
            Ok(&records)
        );
    }
}
