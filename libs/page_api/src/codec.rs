//! The codec of the page service: prost's, except that an encoder reserves a message's whole
//! encoded length before writing it.
//!
//! tonic grows its encode buffer in steps of its buffer size (8 KiB), so a GetPages answer of
//! 32 pages (256 KiB) was copied into ever larger buffers about thirty times as it was written;
//! one reservation of the known length makes it one allocation and one pass.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

/// A [`Codec`] for the generated client and server (see `build.rs`).
#[derive(Debug, Clone, Copy)]
pub struct PageCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for PageCodec<T, U> {
    fn default() -> Self {
        PageCodec(PhantomData)
    }
}

impl<T, U> Codec for PageCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ReservingEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ReservingEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::default())
    }
}

/// Encodes a message into a buffer reserved to its length.
#[derive(Debug, Clone, Copy)]
pub struct ReservingEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for ReservingEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }
}
