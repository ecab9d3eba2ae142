//! Validators: the content is what its type promises. Each parses
//! untrusted bytes within fixed bounds (depth, decoded size, entries); the
//! process around them is sandboxed and time-limited as well.

use std::io::Read as _;

use crate::rules::{CsvShape, ExportType};

/// Deepest JSON nesting read (serde_json's own recursion limit is 128).
const MAX_JSON_DEPTH: usize = 128;
/// Largest decoded PNG accepted (256 MiB of pixels).
const MAX_PNG_DECODED: usize = 256 << 20;
/// Most entries of a tar archive.
const MAX_TAR_ENTRIES: usize = 10_000;
/// Largest ratio of a gzip stream's decompressed to compressed size.
pub const MAX_GZIP_RATIO: u64 = 100;

/// Why content is not what it claims, for one validator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub ty: ExportType,
    pub detail: String,
    /// A decompression bomb (counted apart from other invalid content).
    pub bomb: bool,
}

fn invalid(ty: ExportType, detail: impl Into<String>) -> Invalid {
    Invalid {
        ty,
        detail: detail.into(),
        bomb: false,
    }
}

/// Checks `bytes` (already known to be UTF-8 without NUL when `ty` is a
/// text type) as `ty`.
pub fn validate(ty: ExportType, bytes: &[u8], csv: Option<&CsvShape>) -> Result<(), Invalid> {
    match ty {
        ExportType::Text => Ok(()),
        ExportType::Json => json(bytes).map_err(|e| invalid(ty, e)),
        ExportType::Ndjson => ndjson(bytes),
        ExportType::Csv => csv_rectangular(bytes, csv),
        ExportType::Png => png(bytes),
        ExportType::Pdf => pdf(bytes),
        ExportType::Parquet => parquet(bytes),
        // Archives are checked by `unpack`, which also yields their content.
        ExportType::Gzip | ExportType::Tar | ExportType::Zip => Ok(()),
    }
}

fn json(bytes: &[u8]) -> Result<(), String> {
    if nesting(bytes) > MAX_JSON_DEPTH {
        return Err(format!("nested deeper than {MAX_JSON_DEPTH} levels"));
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
        .map(drop)
        .map_err(|e| format!("does not parse: {e}"))
}

/// The deepest bracket nesting outside strings (a cheap upper bound that
/// keeps the parser off unbounded recursion).
fn nesting(bytes: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

fn ndjson(bytes: &[u8]) -> Result<(), Invalid> {
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        json(line).map_err(|e| invalid(ExportType::Ndjson, format!("line {}: {e}", i + 1)))?;
    }
    Ok(())
}

fn csv_rectangular(bytes: &[u8], shape: Option<&CsvShape>) -> Result<(), Invalid> {
    let bad = |detail: String| invalid(ExportType::Csv, detail);
    let delimiter = match shape {
        Some(s) => s.delimiter_byte().map_err(bad)?,
        None => b',',
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter)
        .from_reader(bytes);
    let mut record = csv::ByteRecord::new();
    let mut width: Option<usize> = shape.and_then(|s| s.columns);
    let mut row = 0u64;
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(bad(format!("row {}: {e}", row + 1))),
        }
        row += 1;
        if row == 1
            && let Some(header) = shape.and_then(|s| s.header.as_ref())
            && (record.len() != header.len()
                || record
                    .iter()
                    .zip(header)
                    .any(|(got, want)| got != want.as_bytes()))
        {
            // Not the row itself: it is the program's, and may hold anything.
            return Err(bad(format!(
                "the first row ({} fields) is not the header {header:?}",
                record.len()
            )));
        }
        match width {
            None => width = Some(record.len()),
            Some(w) if w != record.len() => {
                return Err(bad(format!(
                    "row {row} has {} fields, expected {w}",
                    record.len()
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn png(bytes: &[u8]) -> Result<(), Invalid> {
    let bad = |detail: String| invalid(ExportType::Png, detail);
    let limits = png::Limits {
        bytes: MAX_PNG_DECODED,
    };
    let mut reader = png::Decoder::new_with_limits(std::io::Cursor::new(bytes), limits)
        .read_info()
        .map_err(|e| bad(format!("does not decode: {e}")))?;
    let size = reader
        .output_buffer_size()
        .filter(|&n| n <= MAX_PNG_DECODED)
        .ok_or_else(|| bad(format!("decodes to more than {MAX_PNG_DECODED} bytes")))?;
    let mut buffer = vec![0; size];
    reader
        .next_frame(&mut buffer)
        .map(drop)
        .map_err(|e| bad(format!("does not decode: {e}")))
}

fn pdf(bytes: &[u8]) -> Result<(), Invalid> {
    let tail = &bytes[bytes.len().saturating_sub(1024)..];
    if !bytes.starts_with(b"%PDF-") {
        return Err(invalid(ExportType::Pdf, "no %PDF- header"));
    }
    if !tail.windows(5).any(|w| w == b"%%EOF") {
        return Err(invalid(ExportType::Pdf, "no %%EOF in its last 1024 bytes"));
    }
    Ok(())
}

fn parquet(bytes: &[u8]) -> Result<(), Invalid> {
    let bad = |detail: &str| invalid(ExportType::Parquet, detail);
    let n = bytes.len();
    if n < 12 || !bytes.starts_with(b"PAR1") || !bytes.ends_with(b"PAR1") {
        return Err(bad("no PAR1 magic at both ends"));
    }
    let mut len = [0u8; 4];
    len.copy_from_slice(&bytes[n - 8..n - 4]);
    let footer = u32::from_le_bytes(len) as usize;
    if footer == 0 || footer > n - 12 {
        return Err(bad("its footer length does not fit the file"));
    }
    Ok(())
}

/// Checks an archive; what a compressed one holds, decompressed, is
/// returned to be scanned for secrets as well (a tar's members are stored
/// as they are, and scanned in the file itself).
pub fn unpack(ty: ExportType, bytes: &[u8], max_bytes: u64) -> Result<Vec<u8>, Invalid> {
    match ty {
        ExportType::Gzip => gunzip(bytes, max_bytes),
        ExportType::Tar => untar(bytes).map(|()| Vec::new()),
        ExportType::Zip => crate::zip::unzip(bytes, max_bytes),
        _ => Ok(Vec::new()),
    }
}

fn gunzip(bytes: &[u8], max_bytes: u64) -> Result<Vec<u8>, Invalid> {
    let bad = |detail: String| invalid(ExportType::Gzip, detail);
    let cap = max_bytes.min((bytes.len() as u64).saturating_mul(MAX_GZIP_RATIO));
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| bad(format!("does not decompress: {e}")))?;
    if out.len() as u64 > cap {
        return Err(Invalid {
            bomb: true,
            ..bad(format!(
                "decompresses to more than {cap} bytes (at most {MAX_GZIP_RATIO}x its size and \
                 the rule's maxBytes): a decompression bomb"
            ))
        });
    }
    // What it holds is judged by its bytes too: an executable does not
    // leave inside a gzip, a tar inside one (.tar.gz) is checked as a tar,
    // and other archives inside are not opened, so they do not leave.
    match crate::detect::detect(&out) {
        crate::detect::Kind::Executable(what) => {
            return Err(bad(format!("it holds an executable ({what})")));
        }
        crate::detect::Kind::Tar => {
            untar(&out).map_err(|e| bad(format!("the tar inside: {}", e.detail)))?;
        }
        kind @ (crate::detect::Kind::Gzip
        | crate::detect::Kind::Zip
        | crate::detect::Kind::OtherArchive(_)) => {
            return Err(bad(format!(
                "it holds {}: nested archives are not opened",
                kind.describe()
            )));
        }
        _ => {}
    }
    Ok(out)
}

/// A tar archive of regular files and directories only: headers whose
/// checksum holds, names (the ustar prefix included) inside the archive, no
/// member that is an executable. Entries are named by their number, never
/// by their name (which the program chose).
fn untar(bytes: &[u8]) -> Result<(), Invalid> {
    let bad = |detail: String| invalid(ExportType::Tar, detail);
    let mut at = 0usize;
    let mut entries = 0usize;
    while at + 512 <= bytes.len() {
        let header = &bytes[at..at + 512];
        if header.iter().all(|&b| b == 0) {
            return Ok(());
        }
        entries += 1;
        let n = entries;
        if entries > MAX_TAR_ENTRIES {
            return Err(bad(format!("more than {MAX_TAR_ENTRIES} entries")));
        }
        let stored = octal(&header[148..156])
            .ok_or_else(|| bad(format!("entry {n}: a checksum that does not parse")))?;
        let sum: u64 = header
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u64::from(b)
                }
            })
            .sum();
        if sum != stored {
            return Err(bad(format!(
                "entry {n}: its header's checksum does not match"
            )));
        }
        let field = |range: std::ops::Range<usize>| {
            String::from_utf8_lossy(&header[range])
                .trim_end_matches('\0')
                .to_owned()
        };
        let (name, prefix) = (field(0..100), field(345..500));
        let full = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let size = octal(&header[124..136])
            .ok_or_else(|| bad(format!("entry {n}: a size that does not parse")))?;
        let regular = match header[156] {
            b'0' | 0 => true,
            b'5' => false,
            other => {
                return Err(bad(format!(
                    "entry {n} is not a regular file or directory (type {:?})",
                    other as char
                )));
            }
        };
        if full.starts_with('/') || full.split('/').any(|c| c == "..") {
            return Err(bad(format!("entry {n} points outside the archive")));
        }
        let start = at
            .checked_add(512)
            .ok_or_else(|| bad(format!("entry {n} runs past the end")))?;
        let blocks = size.div_ceil(512);
        at = usize::try_from(blocks.saturating_mul(512))
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|&end| end <= bytes.len())
            .ok_or_else(|| bad(format!("entry {n} runs past the end")))?;
        let content = usize::try_from(size)
            .ok()
            .and_then(|len| bytes.get(start..start.checked_add(len)?))
            .unwrap_or_default();
        if regular {
            match crate::detect::detect(content) {
                crate::detect::Kind::Executable(what) => {
                    return Err(bad(format!("entry {n} is an executable ({what})")));
                }
                kind @ (crate::detect::Kind::Gzip
                | crate::detect::Kind::Tar
                | crate::detect::Kind::Zip
                | crate::detect::Kind::OtherArchive(_)) => {
                    return Err(bad(format!(
                        "entry {n} is {}: nested archives are not opened",
                        kind.describe()
                    )));
                }
                _ => {}
            }
        }
    }
    Err(bad("no end-of-archive marker".into()))
}

fn octal(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(json: &str) -> CsvShape {
        serde_json::from_str(json).unwrap_or(CsvShape {
            header: None,
            columns: None,
            delimiter: None,
        })
    }

    #[test]
    fn csv_must_be_rectangular_and_match_its_header() {
        assert!(validate(ExportType::Csv, b"a,b\n1,2\n\"x,y\",3\n", None).is_ok());
        let err = validate(ExportType::Csv, b"a,b\n1,2,3\n", None).err();
        assert!(err.is_some_and(|e| e.detail.contains("row 2 has 3 fields")));
        let s = shape(r#"{"header":["id","amount"]}"#);
        assert!(validate(ExportType::Csv, b"id,amount\n1,2\n", Some(&s)).is_ok());
        assert!(validate(ExportType::Csv, b"id,total\n1,2\n", Some(&s)).is_err());
        let s = shape(r#"{"delimiter":";","columns":2}"#);
        assert!(validate(ExportType::Csv, b"a;b\n1;2\n", Some(&s)).is_ok());
        assert!(validate(ExportType::Csv, b"a,b\n", Some(&s)).is_err());
    }

    #[test]
    fn json_and_ndjson_parse_within_depth() {
        assert!(validate(ExportType::Json, br#"{"a":[1,2,{"b":"]]]"}]}"#, None).is_ok());
        assert!(validate(ExportType::Json, b"{\"a\":", None).is_err());
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let err = validate(ExportType::Json, deep.as_bytes(), None).err();
        assert!(err.is_some_and(|e| e.detail.contains("nested deeper")));
        assert!(validate(ExportType::Ndjson, b"{\"a\":1}\n\n[2]\n", None).is_ok());
        let err = validate(ExportType::Ndjson, b"{\"a\":1}\nnope\n", None).err();
        assert!(err.is_some_and(|e| e.detail.starts_with("line 2")));
    }

    #[test]
    fn a_gzip_bomb_is_refused() {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&vec![0u8; 50 << 20]).unwrap_or_default();
        let bomb = gz.finish().unwrap_or_default();
        let err = unpack(ExportType::Gzip, &bomb, 1 << 30).err();
        assert!(
            err.is_some_and(|e| e.bomb && e.detail.contains("bomb")),
            "{} bytes",
            bomb.len()
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"hello, world\n").unwrap_or_default();
        let ok = gz.finish().unwrap_or_default();
        assert_eq!(
            unpack(ExportType::Gzip, &ok, 1 << 20).ok(),
            Some(b"hello, world\n".to_vec())
        );
    }

    fn tar_entry(name: &str, prefix: &str, data: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..108].copy_from_slice(b"0000644\0");
        h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
        h[148..156].copy_from_slice(b"        ");
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let mut out = h;
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
        out
    }

    fn tar(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out: Vec<u8> = entries.concat();
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    #[test]
    fn a_tar_is_checked_header_by_header() {
        let fine = tar(&[tar_entry("a.csv", "", b"id\n1\n")]);
        assert!(unpack(ExportType::Tar, &fine, 1 << 20).is_ok());
        let outside = tar(&[tar_entry("x.csv", "../..", b"id\n")]);
        let err = unpack(ExportType::Tar, &outside, 1 << 20).err();
        assert!(err.is_some_and(|e| e.detail.contains("outside")));
        let elf = tar(&[tar_entry("tool", "", b"\x7fELF\x02\x01\x01\0\0\0\0\0")]);
        let err = unpack(ExportType::Tar, &elf, 1 << 20).err();
        assert!(err.is_some_and(|e| e.detail.contains("executable")));
        let mut forged = fine.clone();
        forged[0] = b'b';
        let err = unpack(ExportType::Tar, &forged, 1 << 20).err();
        assert!(err.is_some_and(|e| e.detail.contains("checksum")));
    }

    #[test]
    fn an_executable_inside_a_gzip_is_refused() {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"\x7fELF\x02\x01\x01\0\0\0\0\0")
            .unwrap_or_default();
        let packed = gz.finish().unwrap_or_default();
        let err = unpack(ExportType::Gzip, &packed, 1 << 20).err();
        assert!(err.is_some_and(|e| e.detail.contains("executable") && !e.bomb));
    }

    #[test]
    fn pdf_and_parquet_need_both_ends() {
        assert!(validate(ExportType::Pdf, b"%PDF-1.4\n...\n%%EOF\n", None).is_ok());
        assert!(validate(ExportType::Pdf, b"%PDF-1.4\n...", None).is_err());
        assert!(validate(ExportType::Parquet, b"PAR1xxxx\x04\0\0\0PAR1", None).is_ok());
        assert!(validate(ExportType::Parquet, b"PAR1xxxx\xff\0\0\0PAR1", None).is_err());
    }
}
