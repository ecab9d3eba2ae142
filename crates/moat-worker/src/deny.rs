//! The parts of WASI a worker is refused, each refusal recorded.
//!
//! wasmtime-wasi's own checks would refuse these too, but silently: a
//! guest without a preopen never even reaches the host. Here the guest
//! gets an empty root directory whose every `open-at` is refused and
//! recorded, and socket creation and name lookup that are refused and
//! recorded before any host socket exists. The definitions replace
//! wasmtime-wasi's whole instances in the linker: its filesystem and name
//! lookup are wrapped (every other call passes through), socket creation
//! is refused outright.

use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::filesystem::WasiFilesystemCtxView;
use wasmtime_wasi::p2::bindings::filesystem::types as async_filesystem;
use wasmtime_wasi::p2::bindings::sockets::ip_name_lookup::{
    self as lookup, Network, ResolveAddressStream,
};
use wasmtime_wasi::p2::bindings::sockets::network::{
    self, ErrorCode as NetError, IpAddress, IpAddressFamily,
};
use wasmtime_wasi::p2::bindings::sync::filesystem::types as sync_filesystem;
use wasmtime_wasi::p2::bindings::sync::io::streams;
use wasmtime_wasi::p2::bindings::sync::sockets::tcp::TcpSocket;
use wasmtime_wasi::p2::bindings::sync::sockets::udp::UdpSocket;
use wasmtime_wasi::p2::{DynPollable, FsError, FsResult, SocketError};
use wasmtime_wasi::sockets::WasiSocketsCtxView;

use crate::host::{DenialLog, Host, record};
use moat_worker_api::Denial;

/// The WASI version wasmtime-wasi defines its interfaces under; a guest
/// importing any 0.2.x is linked to these (semver-compatible lookup).
pub(crate) const WASI_VERSION: &str = "0.2.6";

/// The guest's root directory is this; the paths it asks for are
/// relative to it, and recorded absolute.
pub(crate) const ROOT: &str = "/";

pub(crate) fn shadow(linker: &mut Linker<Host>) -> anyhow::Result<()> {
    linker.allow_shadowing(true);
    sync_filesystem::add_to_linker::<Host, GuardedFs>(linker, |host| Guarded {
        denials: &host.denials,
        fs: WasiFilesystemCtxView {
            ctx: host.wasi.filesystem(),
            table: &mut host.table,
        },
    })?;
    lookup::add_to_linker::<Host, GuardedNet>(linker, |host| GuardedLookup {
        denials: &host.denials,
        net: WasiSocketsCtxView {
            ctx: host.wasi.sockets(),
            table: &mut host.table,
        },
    })?;
    let mut tcp = linker.instance(&format!("wasi:sockets/tcp-create-socket@{WASI_VERSION}"))?;
    tcp.func_wrap(
        "create-tcp-socket",
        |mut store, (family,): (IpAddressFamily,)| {
            refuse_socket(&store.data_mut().denials, family, "tcp");
            Ok((Err::<Resource<TcpSocket>, _>(NetError::AccessDenied),))
        },
    )?;
    let mut udp = linker.instance(&format!("wasi:sockets/udp-create-socket@{WASI_VERSION}"))?;
    udp.func_wrap(
        "create-udp-socket",
        |mut store, (family,): (IpAddressFamily,)| {
            refuse_socket(&store.data_mut().denials, family, "udp");
            Ok((Err::<Resource<UdpSocket>, _>(NetError::AccessDenied),))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

fn refuse_socket(denials: &DenialLog, family: IpAddressFamily, protocol: &str) {
    let family = match family {
        IpAddressFamily::Ipv4 => "ipv4",
        IpAddressFamily::Ipv6 => "ipv6",
    };
    let denial = Denial::Socket {
        address: family.into(),
        purpose: format!("create a {protocol} socket"),
    };
    record(denials, denial);
}

/// The path as the guest meant it: the root is its only directory, so a
/// relative path is one under `/`.
fn absolute(path: &str) -> String {
    let trimmed = path.trim_start_matches('/');
    // Control characters would let a guest forge lines in a log.
    let clean: String = trimmed
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(512)
        .collect();
    format!("{ROOT}{clean}")
}

struct GuardedFs;

impl HasData for GuardedFs {
    type Data<'a> = Guarded<'a>;
}

/// wasmtime-wasi's filesystem with `open-at` refused and recorded.
pub(crate) struct Guarded<'a> {
    denials: &'a DenialLog,
    fs: WasiFilesystemCtxView<'a>,
}

struct GuardedNet;

impl HasData for GuardedNet {
    type Data<'a> = GuardedLookup<'a>;
}

/// wasmtime-wasi's name lookup with `resolve-addresses` refused and
/// recorded.
pub(crate) struct GuardedLookup<'a> {
    denials: &'a DenialLog,
    net: WasiSocketsCtxView<'a>,
}

impl lookup::Host for GuardedLookup<'_> {
    fn resolve_addresses(
        &mut self,
        _network: Resource<Network>,
        name: String,
    ) -> Result<Resource<ResolveAddressStream>, SocketError> {
        let address: String = name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .take(256)
            .collect();
        let denial = Denial::Socket {
            address,
            purpose: "resolve".into(),
        };
        record(self.denials, denial);
        Err(NetError::AccessDenied.into())
    }
}

impl network::Host for GuardedLookup<'_> {
    fn convert_error_code(&mut self, error: SocketError) -> anyhow::Result<NetError> {
        network::Host::convert_error_code(&mut self.net, error)
    }

    fn network_error_code(
        &mut self,
        error: Resource<streams::Error>,
    ) -> anyhow::Result<Option<NetError>> {
        network::Host::network_error_code(&mut self.net, error)
    }
}

impl network::HostNetwork for GuardedLookup<'_> {
    fn drop(&mut self, this: Resource<Network>) -> anyhow::Result<()> {
        network::HostNetwork::drop(&mut self.net, this)
    }
}

impl lookup::HostResolveAddressStream for GuardedLookup<'_> {
    fn resolve_next_address(
        &mut self,
        stream: Resource<ResolveAddressStream>,
    ) -> Result<Option<IpAddress>, SocketError> {
        lookup::HostResolveAddressStream::resolve_next_address(&mut self.net, stream)
    }

    fn subscribe(
        &mut self,
        stream: Resource<ResolveAddressStream>,
    ) -> anyhow::Result<Resource<DynPollable>> {
        lookup::HostResolveAddressStream::subscribe(&mut self.net, stream)
    }

    fn drop(&mut self, stream: Resource<ResolveAddressStream>) -> anyhow::Result<()> {
        lookup::HostResolveAddressStream::drop(&mut self.net, stream)
    }
}

impl sync_filesystem::Host for Guarded<'_> {
    fn convert_error_code(&mut self, err: FsError) -> anyhow::Result<sync_filesystem::ErrorCode> {
        sync_filesystem::Host::convert_error_code(&mut self.fs, err)
    }
    fn filesystem_error_code(
        &mut self,
        err: Resource<streams::Error>,
    ) -> anyhow::Result<Option<sync_filesystem::ErrorCode>> {
        sync_filesystem::Host::filesystem_error_code(&mut self.fs, err)
    }
}
impl sync_filesystem::HostDescriptor for Guarded<'_> {
    fn advise(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        offset: sync_filesystem::Filesize,
        len: sync_filesystem::Filesize,
        advice: sync_filesystem::Advice,
    ) -> FsResult<()> {
        sync_filesystem::HostDescriptor::advise(&mut self.fs, fd, offset, len, advice)
    }
    fn sync_data(&mut self, fd: Resource<sync_filesystem::Descriptor>) -> FsResult<()> {
        sync_filesystem::HostDescriptor::sync_data(&mut self.fs, fd)
    }
    fn get_flags(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
    ) -> FsResult<sync_filesystem::DescriptorFlags> {
        sync_filesystem::HostDescriptor::get_flags(&mut self.fs, fd)
    }
    fn get_type(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
    ) -> FsResult<sync_filesystem::DescriptorType> {
        sync_filesystem::HostDescriptor::get_type(&mut self.fs, fd)
    }
    fn set_size(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        size: sync_filesystem::Filesize,
    ) -> FsResult<()> {
        sync_filesystem::HostDescriptor::set_size(&mut self.fs, fd, size)
    }
    fn set_times(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        atim: sync_filesystem::NewTimestamp,
        mtim: sync_filesystem::NewTimestamp,
    ) -> FsResult<()> {
        sync_filesystem::HostDescriptor::set_times(&mut self.fs, fd, atim, mtim)
    }
    fn read(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        len: sync_filesystem::Filesize,
        offset: sync_filesystem::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        sync_filesystem::HostDescriptor::read(&mut self.fs, fd, len, offset)
    }
    fn write(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        buf: Vec<u8>,
        offset: sync_filesystem::Filesize,
    ) -> FsResult<sync_filesystem::Filesize> {
        sync_filesystem::HostDescriptor::write(&mut self.fs, fd, buf, offset)
    }
    fn read_directory(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
    ) -> FsResult<Resource<sync_filesystem::DirectoryEntryStream>> {
        sync_filesystem::HostDescriptor::read_directory(&mut self.fs, fd)
    }
    fn sync(&mut self, fd: Resource<sync_filesystem::Descriptor>) -> FsResult<()> {
        sync_filesystem::HostDescriptor::sync(&mut self.fs, fd)
    }
    fn create_directory_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        sync_filesystem::HostDescriptor::create_directory_at(&mut self.fs, fd, path)
    }
    fn stat(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
    ) -> FsResult<sync_filesystem::DescriptorStat> {
        sync_filesystem::HostDescriptor::stat(&mut self.fs, fd)
    }
    fn stat_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        path_flags: sync_filesystem::PathFlags,
        path: String,
    ) -> FsResult<sync_filesystem::DescriptorStat> {
        sync_filesystem::HostDescriptor::stat_at(&mut self.fs, fd, path_flags, path)
    }
    fn set_times_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        path_flags: sync_filesystem::PathFlags,
        path: String,
        atim: sync_filesystem::NewTimestamp,
        mtim: sync_filesystem::NewTimestamp,
    ) -> FsResult<()> {
        sync_filesystem::HostDescriptor::set_times_at(
            &mut self.fs,
            fd,
            path_flags,
            path,
            atim,
            mtim,
        )
    }
    fn link_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        old_path_flags: sync_filesystem::PathFlags,
        old_path: String,
        new_descriptor: Resource<sync_filesystem::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        sync_filesystem::HostDescriptor::link_at(
            &mut self.fs,
            fd,
            old_path_flags,
            old_path,
            new_descriptor,
            new_path,
        )
    }
    fn open_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        path_flags: sync_filesystem::PathFlags,
        path: String,
        oflags: sync_filesystem::OpenFlags,
        flags: sync_filesystem::DescriptorFlags,
    ) -> FsResult<Resource<sync_filesystem::Descriptor>> {
        let _ = (fd, path_flags, oflags, flags);
        record(
            self.denials,
            Denial::File {
                path: absolute(&path),
            },
        );
        Err(async_filesystem::ErrorCode::NotPermitted.into())
    }
    fn drop(&mut self, fd: Resource<sync_filesystem::Descriptor>) -> anyhow::Result<()> {
        sync_filesystem::HostDescriptor::drop(&mut self.fs, fd)
    }
    fn readlink_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        path: String,
    ) -> FsResult<String> {
        sync_filesystem::HostDescriptor::readlink_at(&mut self.fs, fd, path)
    }
    fn remove_directory_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        sync_filesystem::HostDescriptor::remove_directory_at(&mut self.fs, fd, path)
    }
    fn rename_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        old_path: String,
        new_fd: Resource<sync_filesystem::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        sync_filesystem::HostDescriptor::rename_at(&mut self.fs, fd, old_path, new_fd, new_path)
    }
    fn symlink_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        src_path: String,
        dest_path: String,
    ) -> FsResult<()> {
        sync_filesystem::HostDescriptor::symlink_at(&mut self.fs, fd, src_path, dest_path)
    }
    fn unlink_file_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        sync_filesystem::HostDescriptor::unlink_file_at(&mut self.fs, fd, path)
    }
    fn read_via_stream(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        offset: sync_filesystem::Filesize,
    ) -> FsResult<Resource<streams::InputStream>> {
        sync_filesystem::HostDescriptor::read_via_stream(&mut self.fs, fd, offset)
    }
    fn write_via_stream(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        offset: sync_filesystem::Filesize,
    ) -> FsResult<Resource<streams::OutputStream>> {
        sync_filesystem::HostDescriptor::write_via_stream(&mut self.fs, fd, offset)
    }
    fn append_via_stream(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
    ) -> FsResult<Resource<streams::OutputStream>> {
        sync_filesystem::HostDescriptor::append_via_stream(&mut self.fs, fd)
    }
    fn is_same_object(
        &mut self,
        a: Resource<sync_filesystem::Descriptor>,
        b: Resource<sync_filesystem::Descriptor>,
    ) -> anyhow::Result<bool> {
        sync_filesystem::HostDescriptor::is_same_object(&mut self.fs, a, b)
    }
    fn metadata_hash(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
    ) -> FsResult<sync_filesystem::MetadataHashValue> {
        sync_filesystem::HostDescriptor::metadata_hash(&mut self.fs, fd)
    }
    fn metadata_hash_at(
        &mut self,
        fd: Resource<sync_filesystem::Descriptor>,
        path_flags: sync_filesystem::PathFlags,
        path: String,
    ) -> FsResult<sync_filesystem::MetadataHashValue> {
        sync_filesystem::HostDescriptor::metadata_hash_at(&mut self.fs, fd, path_flags, path)
    }
}
impl sync_filesystem::HostDirectoryEntryStream for Guarded<'_> {
    fn read_directory_entry(
        &mut self,
        stream: Resource<sync_filesystem::DirectoryEntryStream>,
    ) -> FsResult<Option<sync_filesystem::DirectoryEntry>> {
        sync_filesystem::HostDirectoryEntryStream::read_directory_entry(&mut self.fs, stream)
    }
    fn drop(
        &mut self,
        stream: Resource<sync_filesystem::DirectoryEntryStream>,
    ) -> anyhow::Result<()> {
        sync_filesystem::HostDirectoryEntryStream::drop(&mut self.fs, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::absolute;

    #[test]
    fn a_path_is_recorded_absolute_and_printable() {
        assert_eq!(absolute("etc/passwd"), "/etc/passwd");
        assert_eq!(absolute("/etc/passwd"), "/etc/passwd");
        assert_eq!(absolute("a\nb"), "/a?b");
    }
}
