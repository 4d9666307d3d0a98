//! The ingest body decoder: never panics, and decoding the body in chunks cut anywhere gives
//! exactly what decoding it whole gives (the same records or the same error). Records that
//! decode encode back to records that decode the same.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pageserver_api::ingest::{decode_batch, encode_batch, BatchDecoder};

fuzz_target!(|input: &[u8]| {
    // The first byte sets the largest payload, the second where the chunks are cut.
    let [max, stride, body @ ..] = input else {
        return;
    };
    let max_payload = usize::from(*max) * 64;
    let stride = usize::from(*stride).max(1);
    let body = Bytes::copy_from_slice(body);
    let whole = decode_batch(body.clone(), max_payload);

    let mut decoder = BatchDecoder::new(max_payload);
    let mut fed = Ok(());
    for start in (0..body.len()).step_by(stride) {
        fed = decoder.feed(body.slice(start..(start + stride).min(body.len())));
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
});
