//! Chooses the layer decompressor from the first bytes (gzip, zstd or a plain tar), ignoring
//! the media type: registries and tools are known to label layers wrongly.

use std::io::{self, BufRead, BufReader, Read};

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    Gzip,
    Zstd,
    None,
}

/// Peeks at the buffered input and wraps it in the matching decoder.
pub fn open<R: Read + 'static>(
    mut input: BufReader<R>,
) -> io::Result<(Compression, Box<dyn Read>)> {
    let head = input.fill_buf()?;
    if head.starts_with(GZIP_MAGIC) {
        Ok((
            Compression::Gzip,
            Box::new(flate2::bufread::MultiGzDecoder::new(input)),
        ))
    } else if head.starts_with(ZSTD_MAGIC) {
        Ok((
            Compression::Zstd,
            Box::new(zstd::stream::read::Decoder::with_buffer(input)?),
        ))
    } else {
        Ok((Compression::None, Box::new(input)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn roundtrip(bytes: Vec<u8>, want: Compression) {
        let (c, mut r) = open(BufReader::new(io::Cursor::new(bytes))).unwrap();
        assert_eq!(c, want);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"hello layer");
    }

    #[test]
    fn detects_each_format_by_magic() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"hello layer").unwrap();
        roundtrip(gz.finish().unwrap(), Compression::Gzip);
        roundtrip(
            zstd::encode_all(&b"hello layer"[..], 1).unwrap(),
            Compression::Zstd,
        );
        roundtrip(b"hello layer".to_vec(), Compression::None);
    }
}
