//! Reading JSON lines with a bound on their length: a 100 MB line costs the
//! shell one bounded buffer, not 100 MB.

use std::io::{self, BufRead};

/// One line, or the news that it was too long (and has been skipped).
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Text(Vec<u8>),
    TooLong { length: u64 },
}

/// Reads the next line (without its newline). `None` at end of input.
pub fn next_line(reader: &mut impl BufRead, max: usize) -> io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut length: u64 = 0;
    let mut overflow = false;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            if length == 0 && line.is_empty() && !overflow {
                return Ok(None);
            }
            break;
        }
        let (chunk, found) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], Some(i)),
            None => (buf, None),
        };
        length += chunk.len() as u64;
        if !overflow {
            if line.len() + chunk.len() > max {
                overflow = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let consumed = found.map_or(chunk.len(), |i| i + 1);
        reader.consume(consumed);
        if found.is_some() {
            break;
        }
    }
    Ok(Some(if overflow {
        Line::TooLong { length }
    } else {
        Line::Text(line)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_skipped_whole_and_the_next_is_read() {
        let mut input = Vec::new();
        input.extend(std::iter::repeat_n(b'x', 5000));
        input.extend(b"\n{\"ok\":1}\nlast");
        let mut reader = io::BufReader::with_capacity(64, &input[..]);
        assert_eq!(
            next_line(&mut reader, 100).unwrap(),
            Some(Line::TooLong { length: 5000 })
        );
        assert_eq!(
            next_line(&mut reader, 100).unwrap(),
            Some(Line::Text(b"{\"ok\":1}".to_vec()))
        );
        assert_eq!(
            next_line(&mut reader, 100).unwrap(),
            Some(Line::Text(b"last".to_vec()))
        );
        assert_eq!(next_line(&mut reader, 100).unwrap(), None);
    }
}
