//! Opens the byte stream to the host for each mode of the command line.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use crate::log::log;
use crate::sys;

pub type Stream = (Box<dyn Read + Send>, Box<dyn Write + Send>);

/// fd 0 and 1, moved to descriptors above 2 that are close-on-exec, so execs never see the
/// protocol stream; 0 and 1 are then `/dev/null`, so nothing that reaches the agent's own
/// standard descriptors (`/proc/1/fd/1` is refused anyway: the agent is non-dumpable) can
/// write into the link or read from it. stderr stays: it is the agent's log.
pub fn stdio() -> io::Result<Stream> {
    let reader = File::from(io::stdin().as_fd().try_clone_to_owned()?);
    let writer = File::from(io::stdout().as_fd().try_clone_to_owned()?);
    match OpenOptions::new().read(true).write(true).open("/dev/null") {
        Ok(null) => {
            sys::redirect(0, &null)?;
            sys::redirect(1, &null)?;
        }
        Err(e) => log!("no /dev/null ({e}): fds 0 and 1 still hold the host stream"),
    }
    Ok(boxed(reader, writer))
}

pub fn unix(path: &str) -> io::Result<Stream> {
    let stream = UnixStream::connect(path)?;
    let writer = stream.try_clone()?;
    Ok(boxed(stream, writer))
}

pub fn vsock(port: u32) -> io::Result<Stream> {
    let sock = File::from(sys::vsock_connect(port)?);
    let writer = sock.try_clone()?;
    Ok(boxed(sock, writer))
}

fn boxed(reader: impl Read + Send + 'static, writer: impl Write + Send + 'static) -> Stream {
    (
        Box::new(BufReader::with_capacity(128 * 1024, reader)),
        Box::new(writer),
    )
}
