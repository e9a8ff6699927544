//! Opens the byte stream to the host for each mode of the command line.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use crate::sys;

pub type Stream = (Box<dyn Read + Send>, Box<dyn Write + Send>);

/// fd 0 and 1, duplicated close-on-exec so execs never see the protocol stream.
pub fn stdio() -> io::Result<Stream> {
    let reader = File::from(io::stdin().as_fd().try_clone_to_owned()?);
    let writer = File::from(io::stdout().as_fd().try_clone_to_owned()?);
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
