//! Reading JSON lines with a bound on their length: a 100 MB line costs the
//! shell one bounded buffer, not 100 MB. The reader also tells whether a
//! complete line is already buffered, which is how the shell batches the
//! ledger commits of pipelined operations (group commit).

use std::io::{self, Read};

/// One line, or the news that it was too long (and has been skipped).
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Text(Vec<u8>),
    TooLong { length: u64 },
}

pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
}

const CHUNK: usize = 64 << 10;

impl<R: Read> LineReader<R> {
    pub fn new(inner: R) -> Self {
        LineReader {
            inner,
            buf: vec![0; CHUNK],
            start: 0,
            end: 0,
            eof: false,
        }
    }

    /// Whether the next line is already fully buffered (reading it will not block).
    pub fn has_complete_line(&self) -> bool {
        self.buf[self.start..self.end].contains(&b'\n')
    }

    fn fill(&mut self) -> io::Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(n) => {
                    self.end += n;
                    if n == 0 {
                        self.eof = true;
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The next line (without its newline); `None` at end of input.
    pub fn next_line(&mut self, max: usize) -> io::Result<Option<Line>> {
        let mut line = Vec::new();
        let mut length: u64 = 0;
        let mut overflow = false;
        loop {
            if self.start == self.end && !self.eof {
                self.fill()?;
            }
            if self.start == self.end {
                if length == 0 && !overflow {
                    return Ok(None);
                }
                break;
            }
            let available = &self.buf[self.start..self.end];
            let found = available.iter().position(|b| *b == b'\n');
            let chunk = &available[..found.unwrap_or(available.len())];
            length += chunk.len() as u64;
            if !overflow {
                if line.len() + chunk.len() > max {
                    overflow = true;
                    line = Vec::new();
                } else {
                    line.extend_from_slice(chunk);
                }
            }
            self.start += found.map_or(chunk.len(), |i| i + 1);
            if found.is_some() {
                break;
            }
            if self.start == self.end {
                self.fill()?;
            }
        }
        Ok(Some(if overflow {
            Line::TooLong { length }
        } else {
            Line::Text(line)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_skipped_whole_and_the_next_is_read() {
        let mut input = Vec::new();
        input.extend(std::iter::repeat_n(b'x', 200_000));
        input.extend(b"\n{\"ok\":1}\nlast");
        let mut reader = LineReader::new(&input[..]);
        assert_eq!(
            reader.next_line(100).unwrap(),
            Some(Line::TooLong { length: 200_000 })
        );
        assert!(reader.has_complete_line());
        assert_eq!(
            reader.next_line(100).unwrap(),
            Some(Line::Text(b"{\"ok\":1}".to_vec()))
        );
        assert_eq!(
            reader.next_line(100).unwrap(),
            Some(Line::Text(b"last".to_vec()))
        );
        assert_eq!(reader.next_line(100).unwrap(), None);
    }
}
