//! zip archives, read through their central directory and checked entry by
//! entry before anything of them may leave. What is refused:
//!
//! - anything before the first entry or between entries (a self-extracting
//!   stub), entries that overlap (the overlapping-entry bomb), and local
//!   headers that disagree with the central directory (two readers would
//!   see two different archives);
//! - zip64, several disks, encryption, methods other than stored and
//!   deflate;
//! - names that are absolute, climb out with `..`, hold a NUL or a drive;
//!   symlinks, devices, setuid and setgid entries;
//! - more than [`MAX_ENTRIES`] entries, or content that decompresses past
//!   the rule's size or [`crate::validate::MAX_GZIP_RATIO`] times the
//!   archive (a bomb), or that does not match its declared size and CRC;
//! - an entry that is an executable, or an archive itself (nested
//!   archives are not opened, so they do not leave).
//!
//! Entries are named by their number in messages, never by their name
//! (which the program chose).

use std::io::Read as _;

use crate::detect::{Kind, detect};
use crate::rules::ExportType;
use crate::validate::{Invalid, MAX_GZIP_RATIO};

/// Most entries of a zip archive.
pub const MAX_ENTRIES: usize = 10_000;

const END_OF_DIRECTORY: u32 = 0x0605_4b50;
const DIRECTORY_ENTRY: u32 = 0x0201_4b50;
const LOCAL_HEADER: u32 = 0x0403_4b50;
const DATA_DESCRIPTOR: u32 = 0x0807_4b50;
const ZIP64_LOCATOR: u32 = 0x0706_4b50;
/// The extra fields common writers add and no reader takes a name, a size
/// or an offset from: NTFS times (7-Zip, Windows), extended timestamps and
/// Unix owners (Info-ZIP, macOS). Any other (zip64 sizes, a Unicode path
/// that some readers use instead of the checked name) is refused.
const KNOWN_EXTRA: [u16; 3] = [0x000a, 0x5455, 0x7875];
/// The end-of-directory record without its comment.
const END_LEN: usize = 22;

fn bad(detail: impl Into<String>) -> Invalid {
    Invalid {
        ty: ExportType::Zip,
        detail: detail.into(),
        bomb: false,
    }
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// One central-directory entry, as far as these checks need it.
struct Entry<'a> {
    flags: u16,
    method: u16,
    crc: u32,
    compressed: u64,
    size: u64,
    name: &'a [u8],
    /// Unix mode bits, when recorded.
    mode: Option<u32>,
    offset: u64,
}

/// Checks a zip archive; returns what its entries hold, decompressed, to
/// be scanned for secrets as well.
pub fn unzip(bytes: &[u8], max_bytes: u64) -> Result<Vec<u8>, Invalid> {
    let end = end_of_directory(bytes)?;
    let disks = (u16_at(bytes, end + 4), u16_at(bytes, end + 6));
    let (here, total) = (u16_at(bytes, end + 8), u16_at(bytes, end + 10));
    let (dir_len, dir_at) = (u32_at(bytes, end + 12), u32_at(bytes, end + 16));
    let (Some(here), Some(total), Some(dir_len), Some(dir_at)) = (here, total, dir_len, dir_at)
    else {
        return Err(bad("its end-of-directory record is cut short"));
    };
    if disks != (Some(0), Some(0)) || here != total {
        return Err(bad("it spans several disks"));
    }
    if total == u16::MAX || dir_len == u32::MAX || dir_at == u32::MAX {
        return Err(bad("zip64 is not supported"));
    }
    let (dir_at, dir_len) = (dir_at as usize, dir_len as usize);
    if dir_at.checked_add(dir_len) != Some(end) {
        return Err(bad(
            "its central directory does not end where the end record starts",
        ));
    }
    let total = usize::from(total);
    if total > MAX_ENTRIES {
        return Err(bad(format!("more than {MAX_ENTRIES} entries")));
    }
    let cap = max_bytes.min((bytes.len() as u64).saturating_mul(MAX_GZIP_RATIO));
    let mut inside = Vec::new();
    let mut at = dir_at;
    // Where the next entry's local header must start: entries tile the
    // archive from its first byte to the central directory.
    let mut next = 0usize;
    for n in 1..=total {
        let (entry, len) = directory_entry(bytes, at, n)?;
        at += len;
        if at > end {
            return Err(bad(format!("entry {n} runs into the end record")));
        }
        check_entry(&entry, n)?;
        let offset = usize::try_from(entry.offset).unwrap_or(usize::MAX);
        if offset != next {
            return Err(bad(format!(
                "entry {n} does not start where the one before it ends \
                 (data outside the entries, or entries that overlap)"
            )));
        }
        let (data, data_end) = local_data(bytes, &entry, n, dir_at)?;
        next = after_descriptor(bytes, &entry, data_end, dir_at);
        let content = inflate(
            &entry,
            data,
            n,
            cap.saturating_sub(inside.len() as u64),
            cap,
        )?;
        match detect(&content) {
            Kind::Executable(what) => {
                return Err(bad(format!("entry {n} is an executable ({what})")));
            }
            Kind::Script => {
                return Err(bad(format!(
                    "entry {n} is a script (#!): a script leaves as a file of its own, under a rule that allows it"
                )));
            }
            Kind::Binary(None) => {
                return Err(bad(format!("entry {n} is binary data of no known type")));
            }
            Kind::Gzip | Kind::Tar | Kind::Zip | Kind::OtherArchive(_) => {
                return Err(bad(format!(
                    "entry {n} is an archive itself ({}): nested archives are not opened",
                    detect(&content).describe()
                )));
            }
            _ => {}
        }
        inside.extend_from_slice(&content);
    }
    if at != end {
        return Err(bad("its central directory holds more than its entries"));
    }
    if next != dir_at {
        return Err(bad(
            "data sits between the last entry and the central directory",
        ));
    }
    Ok(inside)
}

/// Where the end-of-directory record is: the last 22 bytes, without a
/// comment. A comment could hold a second end record (or a zip64 locator
/// could sit before it) that another reader takes instead of this one.
fn end_of_directory(bytes: &[u8]) -> Result<usize, Invalid> {
    let at = bytes
        .len()
        .checked_sub(END_LEN)
        .ok_or_else(|| bad("too short"))?;
    if u32_at(bytes, at) != Some(END_OF_DIRECTORY) || u16_at(bytes, at + 20) != Some(0) {
        return Err(bad(
            "the file does not end with an end-of-directory record without a comment",
        ));
    }
    if at >= 20 && u32_at(bytes, at - 20) == Some(ZIP64_LOCATOR) {
        return Err(bad("zip64 is not supported"));
    }
    Ok(at)
}

/// The entry at `at` of the central directory and its length there.
fn directory_entry(bytes: &[u8], at: usize, n: usize) -> Result<(Entry<'_>, usize), Invalid> {
    let short = || bad(format!("entry {n}: its directory record is cut short"));
    if u32_at(bytes, at) != Some(DIRECTORY_ENTRY) {
        return Err(bad(format!(
            "entry {n}: no directory record where one should be"
        )));
    }
    let flags = u16_at(bytes, at + 8).ok_or_else(short)?;
    let method = u16_at(bytes, at + 10).ok_or_else(short)?;
    let crc = u32_at(bytes, at + 16).ok_or_else(short)?;
    let compressed = u32_at(bytes, at + 20).ok_or_else(short)?;
    let size = u32_at(bytes, at + 24).ok_or_else(short)?;
    let name_len = usize::from(u16_at(bytes, at + 28).ok_or_else(short)?);
    let extra_len = usize::from(u16_at(bytes, at + 30).ok_or_else(short)?);
    let comment_len = usize::from(u16_at(bytes, at + 32).ok_or_else(short)?);
    let disk = u16_at(bytes, at + 34).ok_or_else(short)?;
    let external = u32_at(bytes, at + 38).ok_or_else(short)?;
    let offset = u32_at(bytes, at + 42).ok_or_else(short)?;
    if compressed == u32::MAX || size == u32::MAX || offset == u32::MAX {
        return Err(bad("zip64 is not supported"));
    }
    if disk != 0 {
        return Err(bad("it spans several disks"));
    }
    let name = bytes.get(at + 46..at + 46 + name_len).ok_or_else(short)?;
    if comment_len != 0 {
        return Err(bad(format!("entry {n} has a comment")));
    }
    let extra = bytes
        .get(at + 46 + name_len..at + 46 + name_len + extra_len)
        .ok_or_else(short)?;
    check_extra(extra, n)?;
    let len = 46 + name_len + extra_len;
    // The mode in the high half of the external attributes, whatever host
    // made it (some readers honour it for others than Unix).
    let mode = Some(external >> 16).filter(|&m| m != 0);
    Ok((
        Entry {
            flags,
            method,
            crc,
            compressed: u64::from(compressed),
            size: u64::from(size),
            name,
            mode,
            offset: u64::from(offset),
        },
        len,
    ))
}

/// Extra fields tile their space exactly, and each is a known one.
fn check_extra(mut extra: &[u8], n: usize) -> Result<(), Invalid> {
    while !extra.is_empty() {
        let (Some(id), Some(len)) = (u16_at(extra, 0), u16_at(extra, 2)) else {
            return Err(bad(format!("entry {n}: an extra field is cut short")));
        };
        if !KNOWN_EXTRA.contains(&id) {
            return Err(bad(format!(
                "entry {n}: extra field {id:#06x} (zip64 or a path some readers use instead of the name)"
            )));
        }
        extra = extra
            .get(4 + usize::from(len)..)
            .ok_or_else(|| bad(format!("entry {n}: an extra field is cut short")))?;
    }
    Ok(())
}

fn check_entry(entry: &Entry<'_>, n: usize) -> Result<(), Invalid> {
    // Bit 0: encrypted; bit 6: strong encryption; bit 13: the directory
    // itself encrypted.
    if entry.flags & (1 | 1 << 6 | 1 << 13) != 0 {
        return Err(bad(format!("entry {n} is encrypted")));
    }
    if entry.method != 0 && entry.method != 8 {
        return Err(bad(format!(
            "entry {n}: compression method {} (only stored and deflate)",
            entry.method
        )));
    }
    let name = std::str::from_utf8(entry.name)
        .map_err(|_| bad(format!("entry {n}: its name is not UTF-8")))?;
    let outside = name.starts_with(['/', '\\'])
        || name.contains('\0')
        || name.split(['/', '\\']).any(|c| c == "..")
        // A drive letter, or an alternate data stream on Windows.
        || name.contains(':');
    if name.is_empty() || outside {
        return Err(bad(format!("entry {n} points outside the archive")));
    }
    if let Some(mode) = entry.mode {
        const TYPE: u32 = 0o170_000;
        let kind = mode & TYPE;
        // 0: no type recorded (some tools leave it out).
        if kind != 0 && kind != 0o100_000 && kind != 0o040_000 {
            return Err(bad(format!(
                "entry {n} is not a regular file or directory (a symlink, device or pipe)"
            )));
        }
        if mode & 0o6000 != 0 {
            return Err(bad(format!("entry {n} is setuid or setgid")));
        }
        if kind != 0o040_000 && mode & 0o111 != 0 {
            return Err(bad(format!("entry {n} is marked executable")));
        }
    }
    if name.ends_with('/') && entry.size != 0 {
        return Err(bad(format!("entry {n}: a directory with content")));
    }
    Ok(())
}

/// The entry's compressed bytes, after a local header that agrees with
/// the central directory, and where they end.
fn local_data<'a>(
    bytes: &'a [u8],
    entry: &Entry<'_>,
    n: usize,
    dir_at: usize,
) -> Result<(&'a [u8], usize), Invalid> {
    let at = usize::try_from(entry.offset).unwrap_or(usize::MAX);
    let short = || bad(format!("entry {n}: its local header is cut short"));
    if u32_at(bytes, at) != Some(LOCAL_HEADER) {
        return Err(bad(format!("entry {n}: no local header at its offset")));
    }
    let flags = u16_at(bytes, at + 6).ok_or_else(short)?;
    let method = u16_at(bytes, at + 8).ok_or_else(short)?;
    let crc = u32_at(bytes, at + 14).ok_or_else(short)?;
    let compressed = u32_at(bytes, at + 18).ok_or_else(short)?;
    let size = u32_at(bytes, at + 22).ok_or_else(short)?;
    let name_len = usize::from(u16_at(bytes, at + 26).ok_or_else(short)?);
    let extra_len = usize::from(u16_at(bytes, at + 28).ok_or_else(short)?);
    let name = bytes.get(at + 30..at + 30 + name_len).ok_or_else(short)?;
    let extra = bytes
        .get(at + 30 + name_len..at + 30 + name_len + extra_len)
        .ok_or_else(short)?;
    check_extra(extra, n)?;
    let deferred = flags & (1 << 3) != 0;
    if deferred && entry.method == 0 {
        // A stored entry's end is known only from the directory: a
        // streaming reader would look for it in the data.
        return Err(bad(format!(
            "entry {n} is stored with its sizes after the data"
        )));
    }
    let sizes_agree = if deferred {
        // Sizes and CRC follow the data; a header may leave them zero.
        (crc == 0 || crc == entry.crc)
            && (compressed == 0 || u64::from(compressed) == entry.compressed)
            && (size == 0 || u64::from(size) == entry.size)
    } else {
        crc == entry.crc
            && u64::from(compressed) == entry.compressed
            && u64::from(size) == entry.size
    };
    if method != entry.method || name != entry.name || !sizes_agree || flags != entry.flags {
        return Err(bad(format!(
            "entry {n}: its local header disagrees with the central directory"
        )));
    }
    let start = at + 30 + name_len + extra_len;
    let end = usize::try_from(entry.compressed)
        .ok()
        .and_then(|len| start.checked_add(len))
        .filter(|&end| end <= dir_at)
        .ok_or_else(|| bad(format!("entry {n} runs into the central directory")))?;
    Ok((&bytes[start..end], end))
}

/// Where an entry ends: after its data descriptor, when it has one that
/// agrees with the directory (else at its data's end, and the next
/// entry's offset check refuses whatever sits there).
fn after_descriptor(bytes: &[u8], entry: &Entry<'_>, data_end: usize, dir_at: usize) -> usize {
    if entry.flags & (1 << 3) == 0 {
        return data_end;
    }
    let with_signature = u32_at(bytes, data_end) == Some(DATA_DESCRIPTOR);
    let fields = if with_signature {
        data_end + 4
    } else {
        data_end
    };
    let agrees = u32_at(bytes, fields) == Some(entry.crc)
        && u32_at(bytes, fields + 4).map(u64::from) == Some(entry.compressed)
        && u32_at(bytes, fields + 8).map(u64::from) == Some(entry.size);
    if agrees && fields + 12 <= dir_at {
        fields + 12
    } else {
        data_end
    }
}

/// The entry's content, at most `room` bytes of the archive's `cap`.
fn inflate(
    entry: &Entry<'_>,
    data: &[u8],
    n: usize,
    room: u64,
    cap: u64,
) -> Result<Vec<u8>, Invalid> {
    if entry.size > room {
        return Err(bomb(n, cap));
    }
    let content = match entry.method {
        0 => data.to_vec(),
        _ => {
            let mut out = Vec::new();
            let mut decoder = flate2::read::DeflateDecoder::new(data);
            (&mut decoder)
                .take(room.saturating_add(1))
                .read_to_end(&mut out)
                .map_err(|e| bad(format!("entry {n} does not decompress: {e}")))?;
            if out.len() as u64 > room {
                return Err(bomb(n, cap));
            }
            // Bytes after the stream would be hidden from this check and
            // seen by a reader that looks for the next header in the data.
            if decoder.total_in() != data.len() as u64 {
                return Err(bad(format!(
                    "entry {n}: bytes follow its compressed stream"
                )));
            }
            out
        }
    };
    if content.len() as u64 != entry.size {
        return Err(bad(format!(
            "entry {n} holds {} bytes, not the {} its directory says",
            content.len(),
            entry.size
        )));
    }
    let mut crc = flate2::Crc::new();
    crc.update(&content);
    if crc.sum() != entry.crc {
        return Err(bad(format!("entry {n}: its CRC does not match")));
    }
    Ok(content)
}

fn bomb(n: usize, cap: u64) -> Invalid {
    Invalid {
        bomb: true,
        ..bad(format!(
            "entry {n} takes it past {cap} bytes decompressed (at most {MAX_GZIP_RATIO}x its \
             size and the rule's maxBytes): a decompression bomb"
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    struct Member {
        name: &'static str,
        data: Vec<u8>,
        deflate: bool,
        mode: Option<u32>,
    }

    fn member(name: &'static str, data: &[u8]) -> Member {
        Member {
            name,
            data: data.to_vec(),
            deflate: true,
            mode: Some(0o100_644),
        }
    }

    fn crc(data: &[u8]) -> u32 {
        let mut crc = flate2::Crc::new();
        crc.update(data);
        crc.sum()
    }

    /// A zip of `members` after `prefix`, offsets counted from the file's
    /// start (as a self-extracting archive has them); `edit` may change
    /// each central record before it is written.
    fn build(prefix: &[u8], members: &[Member], edit: impl Fn(usize, &mut Vec<u8>)) -> Vec<u8> {
        let mut out = prefix.to_vec();
        let mut directory = Vec::new();
        for (i, m) in members.iter().enumerate() {
            let packed = if m.deflate {
                let mut enc =
                    flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
                enc.write_all(&m.data).unwrap();
                enc.finish().unwrap()
            } else {
                m.data.clone()
            };
            let method: u16 = if m.deflate { 8 } else { 0 };
            let offset = out.len() as u32;
            let common = |v: &mut Vec<u8>| {
                v.extend_from_slice(&0u16.to_le_bytes()); // flags
                v.extend_from_slice(&method.to_le_bytes());
                v.extend_from_slice(&[0; 4]); // time, date
                v.extend_from_slice(&crc(&m.data).to_le_bytes());
                v.extend_from_slice(&(packed.len() as u32).to_le_bytes());
                v.extend_from_slice(&(m.data.len() as u32).to_le_bytes());
                v.extend_from_slice(&(m.name.len() as u16).to_le_bytes());
                v.extend_from_slice(&0u16.to_le_bytes()); // extra
            };
            out.extend_from_slice(&LOCAL_HEADER.to_le_bytes());
            out.extend_from_slice(&20u16.to_le_bytes());
            common(&mut out);
            out.extend_from_slice(m.name.as_bytes());
            out.extend_from_slice(&packed);
            let mut record = DIRECTORY_ENTRY.to_le_bytes().to_vec();
            let made_by: u16 = if m.mode.is_some() { 3 << 8 | 20 } else { 20 };
            record.extend_from_slice(&made_by.to_le_bytes());
            record.extend_from_slice(&20u16.to_le_bytes());
            common(&mut record);
            record.extend_from_slice(&[0; 6]); // comment, disk, internal
            record.extend_from_slice(&(m.mode.unwrap_or(0) << 16).to_le_bytes());
            record.extend_from_slice(&offset.to_le_bytes());
            record.extend_from_slice(m.name.as_bytes());
            edit(i, &mut record);
            directory.extend_from_slice(&record);
        }
        let dir_at = out.len() as u32;
        out.extend_from_slice(&directory);
        let count = members.len() as u16;
        out.extend_from_slice(&END_OF_DIRECTORY.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&(directory.len() as u32).to_le_bytes());
        out.extend_from_slice(&dir_at.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }

    fn refused(zip: &[u8]) -> Invalid {
        unzip(zip, 1 << 30).expect_err("refused")
    }

    #[test]
    fn a_plain_archive_passes_and_yields_its_content() {
        let mut stored = member("notes.txt", b"plain notes\n");
        stored.deflate = false;
        let dir = Member {
            mode: Some(0o040_755),
            ..member("out/", b"")
        };
        let zip = build(
            b"",
            &[member("out/a.csv", b"id,total\n1,2\n"), stored, dir],
            |_, _| {},
        );
        let inside = unzip(&zip, 1 << 20).expect("a plain zip passes");
        assert_eq!(inside, b"id,total\n1,2\nplain notes\n");
    }

    #[test]
    fn a_bomb_is_refused_as_one() {
        let zip = build(
            b"",
            &[member("zeros.txt", &vec![b'0'; 50 << 20])],
            |_, _| {},
        );
        let e = refused(&zip);
        assert!(e.bomb, "{e:?}");
        // Within the ratio but past the rule's size: a bomb too.
        let zip = build(b"", &[member("a.txt", &[b'a'; 4000])], |_, _| {});
        assert!(unzip(&zip, 1000).expect_err("past maxBytes").bomb);
    }

    #[test]
    fn names_links_and_modes_that_could_escape_are_refused() {
        for name in [
            "../up.txt",
            "/etc/cron.d/x",
            "a/../../b",
            "C:/x",
            "..\\x",
            "a.txt:stream",
        ] {
            let zip = build(b"", &[member(name, b"x")], |_, _| {});
            let e = refused(&zip);
            assert!(e.detail.contains("outside the archive"), "{name}: {e:?}");
            assert!(
                !e.detail.contains(name),
                "a name the program chose is not echoed"
            );
        }
        for (mode, says) in [
            (0o120_777, "symlink"),
            (0o020_644, "device"),
            (0o104_755, "setuid"),
            (0o100_755, "marked executable"),
        ] {
            let zip = build(
                b"",
                &[Member {
                    mode: Some(mode),
                    ..member("x", b"/etc/passwd")
                }],
                |_, _| {},
            );
            assert!(refused(&zip).detail.contains(says), "{mode:o}");
        }
    }

    #[test]
    fn executables_and_nested_archives_inside_are_refused() {
        let elf = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0";
        let e = refused(&build(b"", &[member("tool", elf)], |_, _| {}));
        assert!(e.detail.contains("executable"), "{e:?}");
        let inner = build(b"", &[member("a.txt", b"a")], |_, _| {});
        let e = refused(&build(b"", &[member("inner.zip", &inner)], |_, _| {}));
        assert!(e.detail.contains("nested archives"), "{e:?}");
    }

    #[test]
    fn a_stub_before_overlapping_entries_or_data_after_is_refused() {
        let e = refused(&build(b"MZ\x90\0stub", &[member("a.txt", b"a")], |_, _| {}));
        assert!(e.detail.contains("does not start where"), "{e:?}");
        // Two directory records naming one local header.
        let zip = build(
            b"",
            &[member("a.txt", b"a"), member("b.txt", b"b")],
            |i, r| {
                if i == 1 {
                    r[42..46].copy_from_slice(&0u32.to_le_bytes());
                }
            },
        );
        let e = refused(&zip);
        assert!(e.detail.contains("does not start where"), "{e:?}");
        let mut trailing = build(b"", &[member("a.txt", b"a")], |_, _| {});
        trailing.extend_from_slice(b"more");
        assert!(refused(&trailing).detail.contains("end-of-directory"));
    }

    #[test]
    fn what_another_reader_would_see_differently_is_refused() {
        // A comment after the end record (it could hold another one).
        let mut zip = build(b"", &[member("a.txt", b"a")], |_, _| {});
        let n = zip.len();
        zip[n - 2..].copy_from_slice(&4u16.to_le_bytes());
        zip.extend_from_slice(b"note");
        assert!(refused(&zip).detail.contains("without a comment"));
        // A Unicode path extra field, which some readers use for the name.
        let mut unicode = 0x7075u16.to_le_bytes().to_vec();
        unicode.extend_from_slice(&9u16.to_le_bytes());
        unicode.extend_from_slice(b"\x01\0\0\0\0../x");
        let zip = build(b"", &[member("a.txt", b"a")], |_, r| {
            r[30..32].copy_from_slice(&(unicode.len() as u16).to_le_bytes());
            r.extend_from_slice(&unicode);
        });
        assert!(refused(&zip).detail.contains("extra field 0x7075"));
        // Bytes after a deflate stream, inside the entry's compressed size.
        let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(b"abc").unwrap();
        let mut packed = enc.finish().unwrap();
        packed.extend_from_slice(b"PK\x03\x04hidden");
        let entry = Entry {
            flags: 0,
            method: 8,
            crc: crc(b"abc"),
            compressed: packed.len() as u64,
            size: 3,
            name: b"a.txt",
            mode: None,
            offset: 0,
        };
        let e = inflate(&entry, &packed, 1, 1 << 20, 1 << 20).expect_err("trailing bytes");
        assert!(e.detail.contains("follow its compressed stream"), "{e:?}");
        // A script, or binary data of no known type, inside.
        for (data, says) in [
            (&b"#!/bin/sh\nid\n"[..], "script"),
            (b"\0\x01\x02\x03", "no known type"),
        ] {
            let e = refused(&build(b"", &[member("x", data)], |_, _| {}));
            assert!(e.detail.contains(says), "{says}: {e:?}");
        }
    }

    #[test]
    fn headers_that_disagree_or_lie_are_refused() {
        // The directory says another size than the content has.
        let zip = build(b"", &[member("a.txt", b"abc")], |_, r| {
            r[24..28].copy_from_slice(&2u32.to_le_bytes());
        });
        assert!(refused(&zip).detail.contains("disagrees"));
        // Another CRC in both places.
        let mut zip = build(b"", &[member("a.txt", b"abc")], |_, r| {
            r[16..20].copy_from_slice(&7u32.to_le_bytes());
        });
        zip[14..18].copy_from_slice(&7u32.to_le_bytes());
        assert!(refused(&zip).detail.contains("CRC"));
        // Encrypted, and a method other than stored or deflate.
        for (at, value, says) in [(8usize, 1u16, "encrypted"), (10, 12, "method 12")] {
            let mut zip = build(b"", &[member("a.txt", b"abc")], |_, r| {
                r[at..at + 2].copy_from_slice(&value.to_le_bytes());
            });
            zip[at - 2..at].copy_from_slice(&value.to_le_bytes());
            let e = refused(&zip);
            assert!(e.detail.contains(says), "{says}: {e:?}");
        }
    }
}
