//! Framing: a fixed 12-byte header (length, request id, kind, flags) apart
//! from the payload. The maximum payload size is checked here and nowhere else.

use std::io::{Read, Write};

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 12;

/// Largest payload a frame may carry. Output and file chunks are cut below it.
pub const MAX_PAYLOAD: usize = 1024 * 1024;

/// Size of the raw chunks (stdout, stderr, stdin, file data) senders cut.
pub const CHUNK_SIZE: usize = 64 * 1024;

/// Flag: the last chunk of a raw byte stream (stdin, file body).
pub const FLAG_END: u8 = 0x01;

/// Flag: raw `Data` frames with the same id follow this head (fs write body).
pub const FLAG_BODY: u8 = 0x02;

/// What a frame carries. The numbers are wire values: append, never reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// JSON [`crate::Hello`], both ways, first frame of each side.
    Hello = 1,
    /// JSON [`crate::ExecRequest`], host to agent.
    ExecStart = 2,
    /// Raw stdin bytes, host to agent; `FLAG_END` closes stdin.
    Stdin = 3,
    /// Raw stdout bytes, agent to host.
    Stdout = 4,
    /// Raw stderr bytes, agent to host.
    Stderr = 5,
    /// JSON [`crate::ExecExit`], agent to host, always last for an exec.
    ExecExit = 6,
    /// Empty, host to agent: kill the exec's process group.
    ExecKill = 7,
    /// JSON [`crate::FsRequest`], host to agent.
    FsRequest = 8,
    /// Raw file bytes, either way (write body, read result).
    Data = 9,
    /// JSON [`crate::FsResponse`] or [`crate::FsError`], agent to host.
    FsResponse = 10,
    /// JSON [`crate::RequestError`], agent to host: the request failed as a whole.
    Error = 11,
    /// Empty, host to agent: kill everything and exit.
    Shutdown = 12,
    /// Empty, agent to host: shutdown done, the agent exits next.
    ShutdownAck = 13,
    /// JSON [`crate::FlowAck`], host to agent: output of a flow-controlled exec consumed.
    OutputAck = 14,
    /// JSON [`crate::FlowAck`], agent to host: stdin of a flow-controlled exec written.
    StdinAck = 15,
    /// JSON [`crate::TtySize`], host to agent: the new size of an exec's terminal.
    Resize = 16,
    /// JSON [`crate::TcpConnect`], host to agent: open a stream to a guest port.
    TcpConnect = 17,
    /// Empty, agent to host: the stream's connection is up.
    TcpConnected = 18,
    /// Raw stream bytes, either way; empty with `FLAG_END`: the sender's side is done.
    TcpData = 19,
    /// JSON [`crate::FlowAck`], either way: stream bytes passed on.
    TcpAck = 20,
    /// Empty, either way: the stream is over.
    TcpClose = 21,
    /// JSON [`crate::WatchRequest`], host to agent: start watching a path.
    WatchStart = 22,
    /// JSON [`crate::WatchBatch`], agent to host: what changed.
    WatchEvents = 23,
    /// JSON [`crate::FlowAck`] counting batches, host to agent: batches passed on.
    WatchAck = 24,
    /// Empty, host to agent: end the watch.
    WatchStop = 25,
    /// JSON [`crate::WatchEnd`], agent to host, always last for a watch.
    WatchEnd = 26,
    /// JSON [`crate::ExecSignal`], host to agent: signal a running exec's process group.
    ExecSignal = 27,
    /// JSON [`crate::ProcRequest`], host to agent: start, list, page or signal background
    /// processes.
    ProcRequest = 28,
    /// JSON [`crate::ProcReply`], agent to host: the answer to a `ProcRequest`.
    ProcReply = 29,
}

impl Kind {
    /// Every kind, in wire order (used by tests that pin the set).
    pub const ALL: [Kind; 29] = [
        Kind::Hello,
        Kind::ExecStart,
        Kind::Stdin,
        Kind::Stdout,
        Kind::Stderr,
        Kind::ExecExit,
        Kind::ExecKill,
        Kind::FsRequest,
        Kind::Data,
        Kind::FsResponse,
        Kind::Error,
        Kind::Shutdown,
        Kind::ShutdownAck,
        Kind::OutputAck,
        Kind::StdinAck,
        Kind::Resize,
        Kind::TcpConnect,
        Kind::TcpConnected,
        Kind::TcpData,
        Kind::TcpAck,
        Kind::TcpClose,
        Kind::WatchStart,
        Kind::WatchEvents,
        Kind::WatchAck,
        Kind::WatchStop,
        Kind::WatchEnd,
        Kind::ExecSignal,
        Kind::ProcRequest,
        Kind::ProcReply,
    ];

    fn from_wire(byte: u8) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| *k as u8 == byte)
    }
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame payload of {0} bytes exceeds the maximum of {MAX_PAYLOAD}")]
    TooLarge(usize),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("reserved header bytes are not zero")]
    Reserved,
    #[error("stream closed")]
    Closed,
    #[error("i/o on the agent stream: {0}")]
    Io(#[from] std::io::Error),
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub len: usize,
    pub id: u32,
    pub kind: Kind,
    pub flags: u8,
}

impl FrameHeader {
    /// The one place where the size limit and header validity are checked.
    pub fn parse(bytes: &[u8; HEADER_LEN]) -> Result<FrameHeader, FrameError> {
        let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        let id = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        let kind = Kind::from_wire(bytes[8]).ok_or(FrameError::UnknownKind(bytes[8]))?;
        if bytes[10] != 0 || bytes[11] != 0 {
            return Err(FrameError::Reserved);
        }
        check_len(len)?;
        Ok(FrameHeader {
            len,
            id,
            kind,
            flags: bytes[9],
        })
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        // len is checked against MAX_PAYLOAD before any header is built.
        out[0..4].copy_from_slice(&(self.len as u32).to_le_bytes());
        out[4..8].copy_from_slice(&self.id.to_le_bytes());
        out[8] = self.kind as u8;
        out[9] = self.flags;
        out
    }
}

fn check_len(len: usize) -> Result<(), FrameError> {
    if len > MAX_PAYLOAD {
        Err(FrameError::TooLarge(len))
    } else {
        Ok(())
    }
}

/// One frame: header fields and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub id: u32,
    pub kind: Kind,
    pub flags: u8,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn new(id: u32, kind: Kind, payload: Vec<u8>) -> Frame {
        Frame {
            id,
            kind,
            flags: 0,
            payload,
        }
    }

    pub fn with_flags(mut self, flags: u8) -> Frame {
        self.flags = flags;
        self
    }

    pub fn has_flag(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Header plus payload as one buffer (one write keeps frames whole).
    pub fn to_bytes(&self) -> Result<Vec<u8>, FrameError> {
        check_len(self.payload.len())?;
        let header = FrameHeader {
            len: self.payload.len(),
            id: self.id,
            kind: self.kind,
            flags: self.flags,
        };
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&header.encode());
        out.extend_from_slice(&self.payload);
        Ok(out)
    }

    /// Reads one frame from a blocking stream. A clean EOF before the header is `Closed`.
    pub fn read_from(reader: &mut (impl Read + ?Sized)) -> Result<Frame, FrameError> {
        let mut head = [0u8; HEADER_LEN];
        read_header(reader, &mut head)?;
        let header = FrameHeader::parse(&head)?;
        let mut payload = vec![0u8; header.len];
        reader.read_exact(&mut payload)?;
        Ok(Frame {
            id: header.id,
            kind: header.kind,
            flags: header.flags,
            payload,
        })
    }

    /// Writes one frame to a blocking stream and flushes it.
    pub fn write_to(&self, writer: &mut (impl Write + ?Sized)) -> Result<(), FrameError> {
        writer.write_all(&self.to_bytes()?)?;
        writer.flush()?;
        Ok(())
    }
}

fn read_header(
    reader: &mut (impl Read + ?Sized),
    head: &mut [u8; HEADER_LEN],
) -> Result<(), FrameError> {
    let mut filled = 0;
    while filled < HEADER_LEN {
        match reader.read(&mut head[filled..]) {
            Ok(0) if filled == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let frame = Frame::new(7, Kind::Stdout, b"hi".to_vec()).with_flags(FLAG_END);
        let bytes = frame.to_bytes().unwrap();
        let back = Frame::read_from(&mut bytes.as_slice()).unwrap();
        assert_eq!(back, frame);
    }

    #[test]
    fn oversized_length_is_refused_before_allocating() {
        let mut head = FrameHeader {
            len: 0,
            id: 1,
            kind: Kind::Data,
            flags: 0,
        }
        .encode();
        head[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            FrameHeader::parse(&head),
            Err(FrameError::TooLarge(_))
        ));
        let big = Frame::new(1, Kind::Data, vec![0; MAX_PAYLOAD + 1]);
        assert!(matches!(big.to_bytes(), Err(FrameError::TooLarge(_))));
    }

    #[test]
    fn unknown_kind_and_reserved_bytes_are_refused() {
        let mut head = Frame::new(1, Kind::Data, vec![]).to_bytes().unwrap();
        head[8] = 200;
        assert!(matches!(
            Frame::read_from(&mut head.as_slice()),
            Err(FrameError::UnknownKind(200))
        ));
        head[8] = Kind::Data as u8;
        head[11] = 1;
        assert!(matches!(
            Frame::read_from(&mut head.as_slice()),
            Err(FrameError::Reserved)
        ));
    }

    #[test]
    fn clean_eof_is_closed_and_torn_header_is_io() {
        assert!(matches!(
            Frame::read_from(&mut [].as_slice()),
            Err(FrameError::Closed)
        ));
        assert!(matches!(
            Frame::read_from(&mut [1u8, 0, 0].as_slice()),
            Err(FrameError::Io(_))
        ));
    }
}
