//! What a file is, from its bytes alone: a name or an extension says
//! nothing (a program can call an ELF binary `report.csv`).

/// What the bytes look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Not UTF-8-clean binary data of a type this verifier knows no use for
    /// (its MIME type when known).
    Binary(Option<&'static str>),
    /// Machine code or bytecode: ELF, PE, Mach-O, WebAssembly, Java, Dalvik...
    Executable(&'static str),
    /// UTF-8 text that starts with `#!`.
    Script,
    /// UTF-8 text without NUL bytes.
    Text,
    Png,
    Pdf,
    Parquet,
    Gzip,
    Tar,
    Zip,
    /// Another archive or compressed format (7z, xz, bzip2, zstd, rar,
    /// Office documents, Java archives...).
    OtherArchive(&'static str),
}

impl Kind {
    /// For messages and reports.
    pub fn describe(self) -> String {
        match self {
            Kind::Binary(Some(mime)) => format!("binary data ({mime})"),
            Kind::Binary(None) => "binary data".into(),
            Kind::Executable(what) => format!("an executable ({what})"),
            Kind::Script => "a script (#!)".into(),
            Kind::Text => "text".into(),
            Kind::Png => "png".into(),
            Kind::Pdf => "pdf".into(),
            Kind::Parquet => "parquet".into(),
            Kind::Gzip => "gzip".into(),
            Kind::Tar => "tar".into(),
            Kind::Zip => "zip".into(),
            Kind::OtherArchive(mime) => format!("an archive ({mime})"),
        }
    }
}

/// The kind of `bytes` (a whole file).
pub fn detect(bytes: &[u8]) -> Kind {
    // Executables first, by their own magic, before any looser match.
    if bytes.starts_with(b"\x7fELF") {
        return Kind::Executable("ELF");
    }
    if bytes.starts_with(b"PAR1") && bytes.len() >= 12 && bytes.ends_with(b"PAR1") {
        return Kind::Parquet;
    }
    if let Some(t) = infer::get(bytes) {
        let mime = t.mime_type();
        match t.matcher_type() {
            infer::MatcherType::App => return Kind::Executable(mime),
            infer::MatcherType::Archive => {
                return match mime {
                    "application/gzip" => Kind::Gzip,
                    "application/x-tar" => Kind::Tar,
                    "application/zip" => Kind::Zip,
                    "application/pdf" => Kind::Pdf,
                    _ => Kind::OtherArchive(mime),
                };
            }
            // Office documents are zip archives underneath.
            infer::MatcherType::Doc => return Kind::OtherArchive(mime),
            infer::MatcherType::Image if mime == "image/png" => return Kind::Png,
            _ => {}
        }
    }
    if bytes.starts_with(b"%PDF-") {
        return Kind::Pdf;
    }
    if !bytes.contains(&0) && std::str::from_utf8(bytes).is_ok() {
        return if bytes.starts_with(b"#!") {
            Kind::Script
        } else {
            Kind::Text
        };
    }
    Kind::Binary(infer::get(bytes).map(|t| t.mime_type()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_not_names_decides() {
        assert_eq!(
            detect(b"\x7fELF\x02\x01\x01\0\0\0\0\0"),
            Kind::Executable("ELF")
        );
        assert_eq!(
            detect(b"MZ\x90\0\x03\0\0\0"),
            Kind::Executable("application/vnd.microsoft.portable-executable")
        );
        assert_eq!(detect(b"a,b\n1,2\n"), Kind::Text);
        assert_eq!(detect(b"#!/bin/sh\necho hi\n"), Kind::Script);
        assert_eq!(detect(b"a\0b"), Kind::Binary(None));
        assert_eq!(detect(b"\xff\xfe"), Kind::Binary(None));
        assert_eq!(detect(b"\x1f\x8b\x08\0\0\0\0\0\0\x03"), Kind::Gzip);
        assert_eq!(detect(b"PK\x03\x04\x14\0\0\0"), Kind::Zip);
        assert_eq!(detect(b"%PDF-1.7\n%%EOF\n"), Kind::Pdf);
        assert_eq!(detect(b"PAR1\0\0\0\0PAR1"), Kind::Parquet);
        assert_eq!(detect(b""), Kind::Text);
    }
}
