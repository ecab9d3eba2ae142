//! Attack probe for the sandbox tests: run inside `moat exec`, it attempts
//! one forbidden thing and prints `ok` or `errno=N` on stdout. It is built
//! with the tests (`cargo test` builds examples) and bound into the sandbox.

use std::ffi::CString;
use std::io::Read;

fn report(ret: i64) {
    if ret < 0 {
        println!(
            "errno={}",
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        );
    } else {
        println!("ok");
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let what = args.first().map(String::as_str).unwrap_or("");
    let arg = args.get(1).cloned().unwrap_or_default();
    // SAFETY (whole block): each call is a plain syscall with valid or null
    // pointers; the probe exists to make the kernel refuse them.
    let ret: i64 = unsafe {
        match what {
            "ptrace" => libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) as i64,
            "mount" => libc::mount(
                cstr("none").as_ptr(),
                cstr("/tmp").as_ptr(),
                cstr("tmpfs").as_ptr(),
                0,
                std::ptr::null(),
            ) as i64,
            "umount" => libc::umount2(cstr("/proc").as_ptr(), libc::MNT_DETACH) as i64,
            "unshare" => libc::unshare(libc::CLONE_NEWUSER) as i64,
            "unshare-net" => libc::unshare(libc::CLONE_NEWNET) as i64,
            "setns" => {
                let fd = libc::open(cstr("/proc/self/ns/net").as_ptr(), libc::O_RDONLY);
                libc::setns(fd, 0) as i64
            }
            "clone-newuser" => {
                let pid = libc::syscall(
                    libc::SYS_clone,
                    (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
                    0,
                    0,
                    0,
                    0,
                );
                if pid == 0 {
                    libc::_exit(0);
                }
                pid
            }
            "clone3" => libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize),
            "keyctl" => libc::syscall(libc::SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3, 0),
            "add_key" => libc::syscall(
                libc::SYS_add_key,
                cstr("user").as_ptr(),
                cstr("k").as_ptr(),
                cstr("v").as_ptr(),
                1usize,
                -3,
            ),
            "bpf" => libc::syscall(libc::SYS_bpf, 0, std::ptr::null::<u8>(), 0),
            "io_uring" => {
                let mut params = [0u8; 120];
                libc::syscall(libc::SYS_io_uring_setup, 8, params.as_mut_ptr())
            }
            "perf_event_open" => {
                let mut attr = [0u8; 128];
                attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
                libc::syscall(libc::SYS_perf_event_open, attr.as_mut_ptr(), 0, -1, -1, 0)
            }
            "chroot" => libc::chroot(cstr("/tmp").as_ptr()) as i64,
            "pivot_root" => libc::syscall(
                libc::SYS_pivot_root,
                cstr("/tmp").as_ptr(),
                cstr("/tmp").as_ptr(),
            ),
            "userfaultfd" => libc::syscall(libc::SYS_userfaultfd, 0),
            "tiocsti" => {
                let c: libc::c_char = b'x' as libc::c_char;
                libc::ioctl(0, libc::TIOCSTI, &c) as i64
            }
            "tiocsti-highbits" => {
                // The request is an unsigned int: garbage above bit 31 must not slip past.
                let c: libc::c_char = b'x' as libc::c_char;
                libc::syscall(
                    libc::SYS_ioctl,
                    0,
                    0xdead_0000_0000_0000u64 | libc::TIOCSTI,
                    &c,
                )
            }
            "x32" => libc::syscall(libc::SYS_getpid | 0x4000_0000),
            "int80" => {
                // getpid (20) through the i386 entry point; -EPERM comes back in eax.
                let mut eax: i32 = 20;
                std::arch::asm!("int 0x80", inout("eax") eax, options(nostack));
                if eax < 0 {
                    println!("errno={}", -eax);
                    return;
                }
                0
            }
            "packet-socket" => libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) as i64,
            "vsock" => libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0) as i64,
            "raw-socket" => libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_ICMP,
            ) as i64,
            "setuid-file" => {
                let path = cstr(&arg);
                let fd = libc::open(path.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
                if fd < 0 {
                    -1
                } else {
                    libc::fchmod(fd, 0o4755) as i64
                }
            }
            "create-setuid" => {
                libc::open(cstr(&arg).as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o4755) as i64
            }
            "connect" => {
                let stream = std::net::TcpStream::connect_timeout(
                    &arg.parse().unwrap_or_else(|_| ([127, 0, 0, 1], 9).into()),
                    std::time::Duration::from_secs(2),
                );
                match stream {
                    Ok(_) => 0,
                    Err(e) => {
                        println!("errno={}", e.raw_os_error().unwrap_or(0));
                        return;
                    }
                }
            }
            "abstract" => {
                let sock = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let mut addr: libc::sockaddr_un = std::mem::zeroed();
                addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
                for (i, b) in arg.bytes().enumerate() {
                    addr.sun_path[i + 1] = b as libc::c_char;
                }
                let len = std::mem::size_of::<libc::sa_family_t>() + 1 + arg.len();
                libc::connect(
                    sock,
                    std::ptr::addr_of!(addr).cast(),
                    len as libc::socklen_t,
                ) as i64
            }
            "kill" => libc::kill(arg.parse().unwrap_or(1), 0) as i64,
            "open-rw" => libc::open(cstr(&arg).as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) as i64,
            "init-caps" => {
                let status = std::fs::read_to_string("/proc/1/status").unwrap_or_default();
                let eff = status
                    .lines()
                    .find(|l| l.starts_with("CapEff:"))
                    .unwrap_or("none");
                println!("{}", eff.split_whitespace().last().unwrap_or("none"));
                return;
            }
            "alloc" => {
                // Allocate and touch ARG MiB, one page at a time.
                let mib: usize = arg.parse().unwrap_or(1024);
                let mut blocks = Vec::new();
                for _ in 0..mib {
                    let mut block = vec![0u8; 1 << 20];
                    for page in block.chunks_mut(4096) {
                        page[0] = 1;
                    }
                    blocks.push(block);
                }
                println!("allocated {}", blocks.len());
                return;
            }
            "fds" => {
                let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
                    .map(|d| {
                        d.filter_map(|e| e.ok())
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                fds.sort();
                // The read_dir handle itself is the highest descriptor; drop it.
                fds.pop();
                println!("{}", fds.join(","));
                return;
            }
            "host-uid" => {
                let mut map = String::new();
                let _ = std::fs::File::open("/proc/self/uid_map")
                    .and_then(|mut f| f.read_to_string(&mut map));
                let uid = libc::getuid();
                let host = map.lines().find_map(|line| {
                    let v: Vec<u32> = line
                        .split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    (v.len() == 3 && uid >= v[0] && uid < v[0] + v[2]).then(|| v[1] + (uid - v[0]))
                });
                println!("{}", host.map_or("unmapped".into(), |h| h.to_string()));
                return;
            }
            _ => {
                eprintln!("probe: unknown check `{what}`");
                std::process::exit(2);
            }
        }
    };
    report(ret);
}
