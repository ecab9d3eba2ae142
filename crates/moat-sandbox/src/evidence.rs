//! Blocked-access evidence: what Landlock refused inside the sandbox, read
//! from the kernel's audit log.
//!
//! Seccomp's refusals need nothing here: they reach the launcher by user
//! notification (see `supervise`). Landlock (ABI 7) logs a denial as an
//! audit record when the domain asked for it
//! (`LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`) and the kernel's audit is on.
//! The launcher listens on the audit netlink socket's read-only multicast
//! group, which takes `CAP_AUDIT_READ`: a root launcher. Every record of the
//! host arrives there; the run's are those of the domain its payload
//! created, which the domain's first record names by its creator's pid. The
//! launcher learns that pid from the payload's own message (the seccomp
//! listener, sent with `SCM_CREDENTIALS`). When the program has ended the
//! launcher logs a marker of its own and reads until the marker comes back:
//! the audit queue is first in, first out, so every denial made before the
//! end has been read by then.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use moat_core::Violation;

const NETLINK_AUDIT: libc::c_int = 9;
/// `AUDIT_NLGRP_READLOG`: every record, read-only.
const READLOG_GROUP: u32 = 1;
const AUDIT_GET: u16 = 1000;
const AUDIT_USER: u16 = 1005;
const AUDIT_LANDLOCK_ACCESS: u16 = 1423;
const AUDIT_LANDLOCK_DOMAIN: u16 = 1424;
const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
/// How long the launcher waits for its marker once the program has ended.
const FLUSH_WAIT: Duration = Duration::from_millis(500);
/// Distinct refusals announced as events; past that they are only counted
/// (a loop must not flood the record).
const MAX_EVENTS: usize = 64;
/// Records of a domain not known yet, and domains remembered, at most.
const MAX_PENDING: usize = 4096;
const MAX_DOMAINS: usize = 4096;
/// Kernel audit records are at most 8970 bytes; a read takes several.
const READ_BUFFER: usize = 64 << 10;
/// Datagrams one [`AuditLog::read`] takes at most.
const READS_PER_CALL: usize = 64;

/// The listening end of the kernel's audit log.
pub(crate) struct AuditLog {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
    /// The kernel's count of dropped records when the run began.
    lost_before: u32,
}

impl AuditLog {
    /// Listens, or says why the evidence layer cannot be enforced here.
    pub(crate) fn open(landlock_abi: u32) -> Result<AuditLog, String> {
        if landlock_abi < 7 {
            return Err(format!(
                "this kernel's Landlock (ABI {landlock_abi}) cannot log denials; ABI 7 can"
            ));
        }
        // SAFETY: plain socket creation; the descriptor is owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                NETLINK_AUDIT,
            )
        };
        if raw < 0 {
            return Err(format!(
                "no kernel audit socket: {}",
                io::Error::last_os_error()
            ));
        }
        // SAFETY: raw is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut log = AuditLog {
            fd,
            seq: 0,
            buf: Vec::new(),
            lost_before: 0,
        };
        // Asked first, on the bare socket: with audit off (the usual case)
        // nothing more is done, and a launch pays one round trip for it.
        match log.status() {
            Ok((true, lost)) => log.lost_before = lost,
            Ok((false, _)) => {
                return Err(
                    "the kernel's audit is off (turn it on with `auditctl -e 1`, Debian package \
                     auditd)"
                        .to_owned(),
                );
            }
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                return Err(
                    "reading the kernel audit log takes CAP_AUDIT_READ (a root launcher)"
                        .to_owned(),
                );
            }
            Err(e) => return Err(format!("cannot ask the kernel whether audit is on: {e}")),
        }
        // Joined now (the request above bound the socket already, so a
        // bind would be refused): the same CAP_AUDIT_READ check applies.
        let group = READLOG_GROUP;
        // SAFETY: a plain u32 option on our own socket.
        let bound = unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_NETLINK,
                libc::NETLINK_ADD_MEMBERSHIP,
                std::ptr::addr_of!(group).cast(),
                std::mem::size_of::<u32>() as libc::socklen_t,
            )
        };
        if bound != 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EPERM) {
                "reading the kernel audit log takes CAP_AUDIT_READ (a root launcher)".to_owned()
            } else {
                format!("cannot listen to the kernel audit log: {e}")
            });
        }
        // A larger buffer loses fewer records on a busy host; best effort.
        let size: libc::c_int = 4 << 20;
        // SAFETY: a plain int option on our own socket.
        unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                std::ptr::addr_of!(size).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        Ok(log)
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn send(&mut self, kind: u16, payload: &[u8]) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let len = NLMSG_HDRLEN + payload.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(payload);
        let to = netlink_address();
        // SAFETY: msg and to are valid for the lengths passed.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                std::ptr::addr_of!(to).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(self.seq)
    }

    /// Whether the kernel's audit is on (`AUDIT_GET`).
    fn enabled(&mut self) -> io::Result<bool> {
        self.status().map(|(enabled, _)| enabled)
    }

    /// The kernel's audit status: on or not, and how many records it has
    /// dropped since boot (backlog full, rate limit), host-wide. Records
    /// that arrive meanwhile are skipped: ask only when none matter.
    fn status(&mut self) -> io::Result<(bool, u32)> {
        let seq = self.send(AUDIT_GET, &[])?;
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            if !self.wait(deadline) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no answer within 1 s",
                ));
            }
            // The answer is small: no need for the records' buffer (a
            // longer record meanwhile is cut short, and skipped anyway).
            let mut small = [0u8; 512];
            let n = match recv_into(self.fd.as_raw_fd(), &mut small) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
                Err(e) => return Err(e),
            };
            for (kind, msg_seq, payload) in messages(&small[..n.min(small.len())]) {
                if msg_seq != seq {
                    continue;
                }
                // struct audit_status: mask, enabled, failure, pid,
                // rate_limit, backlog_limit, lost, ...
                if kind == AUDIT_GET && payload.len() >= 28 {
                    return Ok((ne_u32(&payload[4..8]) != 0, ne_u32(&payload[24..28])));
                }
                if kind == NLMSG_ERROR && payload.len() >= 4 {
                    let errno = -(ne_u32(&payload[..4]) as i32);
                    if errno != 0 {
                        return Err(io::Error::from_raw_os_error(errno));
                    }
                }
            }
        }
    }

    fn recv(&mut self) -> io::Result<usize> {
        if self.buf.is_empty() {
            self.buf = vec![0u8; READ_BUFFER];
        }
        recv_into(self.fd.as_raw_fd(), &mut self.buf)
    }

    /// Waits until something can be read or `deadline` passes (false once
    /// it has, readable or not: a flooded socket must not hold us).
    fn wait(&self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let left = deadline - now;
        let mut pollfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis().saturating_add(1)).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pollfd, 1, ms) > 0 }
    }

    /// Reads what has arrived, without blocking: at most [`READS_PER_CALL`]
    /// datagrams, so that a host busy with audit records never keeps the
    /// launcher from its other work (the rest wait for the next call).
    pub(crate) fn read(&mut self, tracker: &mut Tracker, on_new: &mut dyn FnMut(&Violation)) {
        for _ in 0..READS_PER_CALL {
            let n = match self.recv() {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    tracker.lost = true;
                    continue;
                }
                Err(_) => return,
            };
            let records: Vec<(u16, String)> = messages(&self.buf[..n])
                .filter(|(kind, _, _)| {
                    matches!(
                        *kind,
                        AUDIT_LANDLOCK_ACCESS | AUDIT_LANDLOCK_DOMAIN | AUDIT_USER
                    )
                })
                .map(|(kind, _, payload)| (kind, String::from_utf8_lossy(payload).into_owned()))
                .collect();
            for (kind, text) in records {
                tracker.record(kind, &text, on_new);
            }
        }
    }

    /// Logs a marker and reads until it comes back: then every record
    /// queued before now has been read. False when it did not come back in
    /// time.
    pub(crate) fn flush(
        &mut self,
        tracker: &mut Tracker,
        on_new: &mut dyn FnMut(&Violation),
    ) -> bool {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let marker = format!(
            "moat: a sandbox ended; evidence flush {}-{nanos}",
            std::process::id()
        );
        // NUL-terminated: the kernel drops a user message's last byte,
        // which it takes for the terminator.
        let mut text = marker.clone().into_bytes();
        text.push(0);
        tracker.marker = Some(marker);
        if self.send(AUDIT_USER, &text).is_err() {
            return false;
        }
        let deadline = Instant::now() + FLUSH_WAIT;
        while !tracker.marker_seen {
            if !self.wait(deadline) {
                return false;
            }
            self.read(tracker, on_new);
        }
        // Records the kernel dropped meanwhile (anyone's: the count is the
        // host's) may have been this run's.
        match self.status() {
            Ok((_, lost)) if lost == self.lost_before => {}
            _ => tracker.lost = true,
        }
        true
    }
}

const AUDIT_SET: u16 = 1001;
const AUDIT_STATUS_ENABLED: u32 = 1;

/// Turns the kernel's audit on or off (`AUDIT_SET`, as `auditctl -e`
/// does; takes `CAP_AUDIT_CONTROL`) and returns whether it was on. For
/// tests and host tooling: Moat itself only reads the audit log.
pub fn switch_kernel_audit(on: bool) -> io::Result<bool> {
    // SAFETY: plain socket creation; the descriptor is owned below.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_AUDIT,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut log = AuditLog {
        // SAFETY: raw is a fresh descriptor that nothing else owns.
        fd: unsafe { OwnedFd::from_raw_fd(raw) },
        seq: 0,
        buf: Vec::new(),
        lost_before: 0,
    };
    let was = log.enabled()?;
    // struct audit_status: mask, enabled, then nine fields left zero.
    let mut status = [0u8; 44];
    status[..4].copy_from_slice(&AUDIT_STATUS_ENABLED.to_ne_bytes());
    status[4..8].copy_from_slice(&u32::from(on).to_ne_bytes());
    log.send(AUDIT_SET, &status)?;
    if log.enabled()? != on {
        return Err(io::Error::other("the kernel kept its audit setting"));
    }
    Ok(was)
}

/// One datagram into `buf`, without waiting.
fn recv_into(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is writable for its whole length.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn netlink_address() -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain old data; zero is valid for every field.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr
}

fn ne_u32(bytes: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[..4]);
    u32::from_ne_bytes(word)
}

/// The netlink messages in one datagram: type, sequence number, payload.
fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, u32, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = ne_u32(&buf[..4]) as usize;
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        let seq = ne_u32(&buf[8..12]);
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let payload = &buf[NLMSG_HDRLEN..len];
        // Messages are 4-byte aligned in a datagram.
        let next = (len + 3) & !3;
        buf = buf.get(next..).unwrap_or(&[]);
        // Audit's text payloads may end in NULs.
        let end = payload
            .iter()
            .rposition(|b| *b != 0)
            .map_or(0, |last| last + 1);
        Some((kind, seq, &payload[..end]))
    })
}

struct Access {
    access: String,
    object: Option<String>,
}

/// Which records are this run's, and what they add up to.
#[derive(Default)]
pub(crate) struct Tracker {
    /// The payload's pid in the launcher's namespace, once it is known.
    payload: Option<u32>,
    /// The inode of the sandbox's pid namespace: a domain the program
    /// stacks itself is recognised by its creator living there.
    pid_namespace: Option<u64>,
    /// The run's domains (its payload's, and those its programs made):
    /// never forgotten.
    ours: std::collections::HashSet<String>,
    /// Other domains seen, and the order they came in (at most
    /// [`MAX_DOMAINS`], the oldest forgotten first).
    others: std::collections::HashSet<String>,
    others_order: VecDeque<String>,
    /// Domains announced (id → creator pid) before the payload's pid was
    /// known.
    unresolved: BTreeMap<String, u32>,
    /// Records of domains not known yet, by domain, oldest domain first.
    pending: BTreeMap<String, Vec<Access>>,
    pending_order: VecDeque<String>,
    pending_count: usize,
    counts: BTreeMap<(String, Option<String>), u64>,
    announced: usize,
    /// The socket overflowed, or the kernel dropped records: some refusals
    /// are not counted.
    pub(crate) lost: bool,
    /// More distinct refusals than are listed one by one.
    pub(crate) folded: bool,
    /// Domains the program stacked itself were seen.
    pub(crate) nested: bool,
    marker: Option<String>,
    marker_seen: bool,
}

/// Distinct (access, object) pairs listed one by one; past that, refusals
/// are counted per access only (a program must not grow the launcher's
/// memory or the report without bound).
const MAX_DISTINCT: usize = 256;

impl Tracker {
    pub(crate) fn new(pid_namespace: Option<u64>) -> Tracker {
        Tracker {
            pid_namespace,
            ..Tracker::default()
        }
    }

    pub(crate) fn set_payload(&mut self, pid: u32, on_new: &mut dyn FnMut(&Violation)) {
        self.payload = Some(pid);
        for (domain, creator) in std::mem::take(&mut self.unresolved) {
            self.classify(domain, creator, on_new);
        }
    }

    pub(crate) fn knows_payload(&self) -> bool {
        self.payload.is_some()
    }

    fn record(&mut self, kind: u16, text: &str, on_new: &mut dyn FnMut(&Violation)) {
        let fields = Fields::parse(text);
        match kind {
            AUDIT_LANDLOCK_ACCESS => {
                let Some(domain) = fields.get("domain") else {
                    return;
                };
                let access = Access {
                    access: fields.get("blockers").unwrap_or("unknown").to_owned(),
                    object: fields.object(),
                };
                if self.ours.contains(domain) {
                    self.count(access, on_new);
                } else if !self.others.contains(domain) {
                    self.hold(domain, access);
                }
            }
            AUDIT_LANDLOCK_DOMAIN => {
                if let (Some(domain), Some("allocated"), Some(pid)) = (
                    fields.get("domain"),
                    fields.get("status"),
                    fields.get("pid").and_then(|p| p.parse::<u32>().ok()),
                ) {
                    if self.payload.is_some() {
                        self.classify(domain.to_owned(), pid, on_new);
                    } else if self.unresolved.len() < MAX_DOMAINS {
                        self.unresolved.insert(domain.to_owned(), pid);
                    }
                }
            }
            AUDIT_USER => {
                if let Some(marker) = &self.marker
                    && text.contains(marker.as_str())
                {
                    self.marker_seen = true;
                }
            }
            _ => {}
        }
    }

    /// Whether a domain created by `creator` is the run's: the payload's
    /// own, or one a program of the sandbox stacked (recognised while its
    /// creator still lives in the sandbox's pid namespace).
    fn classify(&mut self, domain: String, creator: u32, on_new: &mut dyn FnMut(&Violation)) {
        let nested = Some(creator) != self.payload
            && self.pid_namespace.is_some()
            && pid_namespace_of(creator) == self.pid_namespace;
        let held = self.pending.remove(&domain).unwrap_or_default();
        self.pending_count -= held.len();
        self.pending_order.retain(|d| *d != domain);
        if Some(creator) == self.payload || nested {
            self.nested |= nested;
            self.ours.insert(domain);
            for access in held {
                self.count(access, on_new);
            }
        } else {
            if self.others_order.len() >= MAX_DOMAINS
                && let Some(oldest) = self.others_order.pop_front()
            {
                self.others.remove(&oldest);
            }
            self.others_order.push_back(domain.clone());
            self.others.insert(domain);
        }
    }

    fn hold(&mut self, domain: &str, access: Access) {
        if self.pending_count >= MAX_PENDING {
            // The oldest unknown domain goes: a record of the run is
            // followed at once by its domain's, so what waits longest is
            // someone else's.
            if let Some(oldest) = self.pending_order.pop_front()
                && let Some(dropped) = self.pending.remove(&oldest)
            {
                self.pending_count -= dropped.len();
            }
        }
        let held = self.pending.entry(domain.to_owned()).or_default();
        if held.is_empty() {
            self.pending_order.push_back(domain.to_owned());
        }
        held.push(access);
        self.pending_count += 1;
    }

    fn count(&mut self, access: Access, on_new: &mut dyn FnMut(&Violation)) {
        let mut key = (access.access, access.object);
        if !self.counts.contains_key(&key) && self.counts.len() >= MAX_DISTINCT {
            self.folded = true;
            key.1 = Some("(more objects, not listed)".to_owned());
        }
        let count = self.counts.entry(key.clone()).or_insert(0);
        *count += 1;
        if *count == 1 && self.announced < MAX_EVENTS {
            self.announced += 1;
            on_new(&Violation {
                layer: "landlock".into(),
                access: key.0,
                object: key.1,
                count: 1,
            });
        }
    }

    pub(crate) fn violations(&self) -> Vec<Violation> {
        self.counts
            .iter()
            .map(|((access, object), count)| Violation {
                layer: "landlock".into(),
                access: access.clone(),
                object: object.clone(),
                count: *count,
            })
            .collect()
    }
}

/// The inode of `pid`'s pid namespace, while it lives.
pub(crate) fn pid_namespace_of(pid: u32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// The `key=value` fields of one audit record's text.
struct Fields<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Fields<'a> {
    fn parse(text: &'a str) -> Self {
        // `audit(1729738800.268:30): domain=... blockers=...`; values with a
        // space or a quote in them are hex-encoded, so spaces split fields.
        let body = text.split_once("): ").map_or(text, |(_, rest)| rest);
        Fields(
            body.split(' ')
                .filter_map(|field| field.split_once('='))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    /// An untrusted string (quoted as is, or hex-encoded), with control
    /// characters escaped: it reaches terminals (`moat audit`).
    fn text(&self, key: &str) -> Option<String> {
        self.raw_text(key).map(|t| {
            t.chars()
                .flat_map(|c| {
                    let escaped: Vec<char> = if c.is_control() {
                        c.escape_default().collect()
                    } else {
                        vec![c]
                    };
                    escaped
                })
                .collect()
        })
    }

    fn raw_text(&self, key: &str) -> Option<String> {
        let value = self.get(key)?;
        if let Some(quoted) = value.strip_prefix('"') {
            return Some(quoted.strip_suffix('"').unwrap_or(quoted).to_owned());
        }
        if value.len() % 2 == 0 && value.bytes().all(|b| b.is_ascii_hexdigit()) {
            let bytes: Option<Vec<u8>> = (0..value.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&value[i..i + 2], 16).ok())
                .collect();
            if let Some(bytes) = bytes {
                return Some(String::from_utf8_lossy(&bytes).into_owned());
            }
        }
        Some(value.to_owned())
    }

    /// What the refused access was for: a path, an address, a process.
    fn object(&self) -> Option<String> {
        if let Some(path) = self.text("path") {
            return Some(path);
        }
        for (address, port) in [("daddr", "dest"), ("saddr", "src"), ("laddr", "lport")] {
            if let Some(port) = self.get(port) {
                return Some(match self.get(address) {
                    Some(ip) if ip.contains(':') => format!("[{ip}]:{port}"),
                    Some(ip) => format!("{ip}:{port}"),
                    None => format!("port {port}"),
                });
            }
        }
        if let Some(pid) = self.get("opid") {
            return Some(match self.text("ocomm") {
                Some(comm) => format!("process {pid} ({comm})"),
                None => format!("process {pid}"),
            });
        }
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn feed(tracker: &mut Tracker, records: &[(u16, &str)]) -> Vec<Violation> {
        let mut seen = Vec::new();
        for (kind, text) in records {
            tracker.record(*kind, text, &mut |v| seen.push(v.clone()));
        }
        seen
    }

    #[test]
    fn keeps_only_the_payloads_domain_and_counts() {
        let mut tracker = Tracker::default();
        let seen = feed(
            &mut tracker,
            &[
                (
                    AUDIT_LANDLOCK_ACCESS,
                    "audit(1.2:30): domain=1a6 blockers=fs.read_file path=\"/root/.aws/credentials\" dev=\"tmpfs\" ino=5",
                ),
                (
                    AUDIT_LANDLOCK_DOMAIN,
                    "audit(1.2:30): domain=1a6 status=allocated mode=enforcing pid=300 uid=0 exe=\"/bin/cat\" comm=\"cat\"",
                ),
                (
                    AUDIT_LANDLOCK_ACCESS,
                    "audit(1.3:31): domain=2b7 blockers=fs.read_file path=\"/etc/other\"",
                ),
                (
                    AUDIT_LANDLOCK_DOMAIN,
                    "audit(1.3:31): domain=2b7 status=allocated mode=enforcing pid=999",
                ),
                (
                    AUDIT_LANDLOCK_ACCESS,
                    "audit(1.4:32): domain=1a6 blockers=fs.read_file path=\"/root/.aws/credentials\"",
                ),
                (
                    AUDIT_LANDLOCK_ACCESS,
                    "audit(1.5:33): domain=1a6 blockers=net.connect_tcp daddr=127.0.0.1 dest=8080",
                ),
                (
                    AUDIT_LANDLOCK_ACCESS,
                    "audit(1.6:34): domain=1a6 blockers=fs.read_file path=2F726F6F742F6120620A",
                ),
            ],
        );
        // Nothing is announced before the payload's pid is known.
        assert!(seen.is_empty());
        let mut late = Vec::new();
        tracker.set_payload(300, &mut |v| late.push(v.clone()));
        let objects: Vec<_> = late.iter().map(|v| v.object.clone().unwrap()).collect();
        // A control character reaches nobody's terminal as is.
        assert_eq!(
            objects,
            ["/root/.aws/credentials", "127.0.0.1:8080", "/root/a b\\n"]
        );
        let all = tracker.violations();
        let creds = all
            .iter()
            .find(|v| v.object.as_deref() == Some("/root/.aws/credentials"))
            .unwrap();
        assert_eq!(creds.count, 2);
        assert_eq!(
            creds.describe(),
            "tried to read /root/.aws/credentials: denied (landlock fs.read_file), 2 times"
        );
        assert!(
            all.iter()
                .all(|v| v.object.as_deref() != Some("/etc/other"))
        );
    }

    #[test]
    fn distinct_refusals_are_capped_and_other_domains_never_push_out_the_runs() {
        let mut tracker = Tracker::default();
        tracker.set_payload(7, &mut |_| {});
        feed(
            &mut tracker,
            &[
                (
                    AUDIT_LANDLOCK_ACCESS,
                    "audit(1:1): domain=a blockers=net.connect_tcp daddr=10.0.0.1 dest=1",
                ),
                (
                    AUDIT_LANDLOCK_DOMAIN,
                    "audit(1:1): domain=a status=allocated pid=7",
                ),
            ],
        );
        // Many other domains come and go.
        for i in 0..(MAX_DOMAINS + 10) {
            let records = [
                (
                    AUDIT_LANDLOCK_ACCESS,
                    format!("audit(1:2): domain=x{i} blockers=fs.read_file path=\"/p\""),
                ),
                (
                    AUDIT_LANDLOCK_DOMAIN,
                    format!("audit(1:2): domain=x{i} status=allocated pid=99"),
                ),
            ];
            for (kind, text) in &records {
                tracker.record(*kind, text, &mut |_| {});
            }
        }
        // The run's domain is still known; a program connecting everywhere
        // is listed up to the cap, then counted per access.
        let mut announced = 0;
        for port in 2..(MAX_DISTINCT as u32 + 50) {
            let text =
                format!("audit(1:3): domain=a blockers=net.connect_tcp daddr=10.0.0.1 dest={port}");
            tracker.record(AUDIT_LANDLOCK_ACCESS, &text, &mut |_| announced += 1);
        }
        let all = tracker.violations();
        assert_eq!(all.len(), MAX_DISTINCT + 1);
        assert!(tracker.folded);
        let folded = all
            .iter()
            .find(|v| v.object.as_deref() == Some("(more objects, not listed)"))
            .unwrap();
        assert_eq!(folded.count, 49); // ports 1..=305, 256 listed
        assert_eq!(announced, MAX_EVENTS - 1);
        assert!(all.iter().all(|v| v.object.as_deref() != Some("/p")));
    }

    #[test]
    fn the_marker_ends_the_flush() {
        let mut tracker = Tracker {
            marker: Some("evidence flush 7-9".into()),
            ..Tracker::default()
        };
        feed(
            &mut tracker,
            &[(
                AUDIT_USER,
                "audit(1.2:3): pid=7 uid=0 msg='moat: a sandbox ended; evidence flush 7-8'",
            )],
        );
        assert!(!tracker.marker_seen);
        feed(
            &mut tracker,
            &[(
                AUDIT_USER,
                "audit(1.2:4): pid=7 uid=0 msg='moat: a sandbox ended; evidence flush 7-9'",
            )],
        );
        assert!(tracker.marker_seen);
    }

    #[test]
    fn netlink_messages_split_and_trim() {
        let mut datagram = Vec::new();
        for (kind, text) in [(1423u16, &b"a=1\0"[..]), (1005, b"b=22")] {
            let len = NLMSG_HDRLEN + text.len();
            datagram.extend_from_slice(&(len as u32).to_ne_bytes());
            datagram.extend_from_slice(&kind.to_ne_bytes());
            datagram.extend_from_slice(&[0, 0]);
            datagram.extend_from_slice(&5u32.to_ne_bytes());
            datagram.extend_from_slice(&0u32.to_ne_bytes());
            datagram.extend_from_slice(text);
            while datagram.len() % 4 != 0 {
                datagram.push(0);
            }
        }
        let got: Vec<_> = messages(&datagram).collect();
        assert_eq!(got, [(1423, 5, &b"a=1"[..]), (1005, 5, &b"b=22"[..])]);
        // A length past the datagram ends the walk instead of reading beyond.
        datagram[0] = 200;
        assert_eq!(messages(&datagram).count(), 0);
    }
}
