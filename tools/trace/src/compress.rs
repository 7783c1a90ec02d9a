//! Trace files may be stored compressed, as `demmio` also accepts: gzip (`.gz`, read and
//! written) and xz (`.xz`, read; the corpus in `tests/traces/` is compressed with `xz -9`, which
//! makes these traces four times smaller than gzip does).

use std::io::{Read, Write};
use std::path::Path;

/// Reads a text file, decompressing it if its name ends in `.gz`.
pub fn read_to_string(path: &Path) -> std::io::Result<String> {
    let raw = std::fs::read(path)?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&raw[..]).read_to_string(&mut s)?;
        Ok(s)
    } else if path.extension().is_some_and(|e| e == "xz") {
        let mut out = Vec::new();
        lzma_rs::xz_decompress(&mut &raw[..], &mut out)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        String::from_utf8(out).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    } else {
        String::from_utf8(raw).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}

/// Writes `text` to `path`, gzip-compressed if the name ends in `.gz`.
pub fn write(path: &Path, text: &[u8]) -> std::io::Result<()> {
    if path.extension().is_some_and(|e| e == "gz") {
        let f = std::fs::File::create(path)?;
        let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::best());
        gz.write_all(text)?;
        gz.finish()?.sync_all()
    } else {
        std::fs::write(path, text)
    }
}
