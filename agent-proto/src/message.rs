//! The typed view of a frame: every message of the protocol, and its encoding.
//! Control messages are JSON (small, debuggable, new optional fields stay compatible);
//! bulk bytes (stdin, stdout, stderr, file data) are raw payloads.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::exec::{ExecExit, ExecRequest, FlowAck, TtySize};
use crate::frame::{Frame, Kind, FLAG_BODY, FLAG_END};
use crate::fs::{FsReply, FsRequest};
use crate::process::{ExecSignal, ProcReply, ProcRequest};
use crate::tcp::TcpConnect;
use crate::watch::{WatchBatch, WatchEnd, WatchRequest};
use crate::{Hello, RequestError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    ExecStart(ExecRequest),
    Stdin {
        data: Vec<u8>,
        end: bool,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    ExecExit(ExecExit),
    ExecKill,
    /// `has_body`: `Data` frames follow (a write's bytes), the last flagged end.
    FsRequest {
        request: FsRequest,
        has_body: bool,
    },
    Data {
        data: Vec<u8>,
        end: bool,
    },
    FsReply(FsReply),
    Error(RequestError),
    Shutdown,
    ShutdownAck,
    /// Only for execs started with a flow window (see [`ExecRequest::flow_window`]).
    OutputAck(FlowAck),
    StdinAck(FlowAck),
    /// Only for execs started with a terminal (see [`ExecRequest::tty`]).
    Resize(TtySize),
    /// Stream messages (see [`crate::tcp`]).
    TcpConnect(TcpConnect),
    TcpConnected,
    TcpData {
        data: Vec<u8>,
        end: bool,
    },
    TcpAck(FlowAck),
    TcpClose,
    /// Watch messages (see [`crate::watch`]).
    WatchStart(WatchRequest),
    WatchEvents(WatchBatch),
    WatchAck(FlowAck),
    WatchStop,
    WatchEnd(WatchEnd),
    /// Signals and background processes (see [`crate::process`]).
    ExecSignal(ExecSignal),
    ProcRequest(ProcRequest),
    ProcReply(ProcReply),
}

#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("{kind:?} payload is not valid: {source}")]
    BadPayload {
        kind: Kind,
        source: serde_json::Error,
    },
    #[error("{0:?} must have an empty payload")]
    UnexpectedPayload(Kind),
    #[error(transparent)]
    Frame(#[from] crate::FrameError),
}

impl Message {
    /// Encodes the message as one frame with request id `id`.
    pub fn into_frame(self, id: u32) -> Result<Frame, MessageError> {
        let end_flag = |end: bool| if end { FLAG_END } else { 0 };
        let frame = match self {
            Message::Hello(m) => json(id, Kind::Hello, &m)?,
            Message::ExecStart(m) => json(id, Kind::ExecStart, &m)?,
            Message::Stdin { data, end } => {
                Frame::new(id, Kind::Stdin, data).with_flags(end_flag(end))
            }
            Message::Stdout(data) => Frame::new(id, Kind::Stdout, data),
            Message::Stderr(data) => Frame::new(id, Kind::Stderr, data),
            Message::ExecExit(m) => json(id, Kind::ExecExit, &m)?,
            Message::ExecKill => Frame::new(id, Kind::ExecKill, Vec::new()),
            Message::FsRequest { request, has_body } => json(id, Kind::FsRequest, &request)?
                .with_flags(if has_body { FLAG_BODY } else { 0 }),
            Message::Data { data, end } => {
                Frame::new(id, Kind::Data, data).with_flags(end_flag(end))
            }
            Message::FsReply(m) => json(id, Kind::FsResponse, &m)?,
            Message::Error(m) => json(id, Kind::Error, &m)?,
            Message::Shutdown => Frame::new(id, Kind::Shutdown, Vec::new()),
            Message::ShutdownAck => Frame::new(id, Kind::ShutdownAck, Vec::new()),
            Message::OutputAck(m) => json(id, Kind::OutputAck, &m)?,
            Message::StdinAck(m) => json(id, Kind::StdinAck, &m)?,
            Message::Resize(m) => json(id, Kind::Resize, &m)?,
            Message::TcpConnect(m) => json(id, Kind::TcpConnect, &m)?,
            Message::TcpConnected => Frame::new(id, Kind::TcpConnected, Vec::new()),
            Message::TcpData { data, end } => {
                Frame::new(id, Kind::TcpData, data).with_flags(end_flag(end))
            }
            Message::TcpAck(m) => json(id, Kind::TcpAck, &m)?,
            Message::TcpClose => Frame::new(id, Kind::TcpClose, Vec::new()),
            Message::WatchStart(m) => json(id, Kind::WatchStart, &m)?,
            Message::WatchEvents(m) => json(id, Kind::WatchEvents, &m)?,
            Message::WatchAck(m) => json(id, Kind::WatchAck, &m)?,
            Message::WatchStop => Frame::new(id, Kind::WatchStop, Vec::new()),
            Message::WatchEnd(m) => json(id, Kind::WatchEnd, &m)?,
            Message::ExecSignal(m) => json(id, Kind::ExecSignal, &m)?,
            Message::ProcRequest(m) => json(id, Kind::ProcRequest, &m)?,
            Message::ProcReply(m) => json(id, Kind::ProcReply, &m)?,
        };
        Ok(frame)
    }

    /// Decodes a frame. Never panics, whatever the bytes.
    pub fn from_frame(frame: Frame) -> Result<Message, MessageError> {
        let end = frame.has_flag(FLAG_END);
        let kind = frame.kind;
        let msg = match kind {
            Kind::Hello => Message::Hello(parse(&frame)?),
            Kind::ExecStart => Message::ExecStart(parse(&frame)?),
            Kind::Stdin => Message::Stdin {
                data: frame.payload,
                end,
            },
            Kind::Stdout => Message::Stdout(frame.payload),
            Kind::Stderr => Message::Stderr(frame.payload),
            Kind::ExecExit => Message::ExecExit(parse(&frame)?),
            Kind::ExecKill => empty(frame, Message::ExecKill)?,
            Kind::FsRequest => Message::FsRequest {
                request: parse(&frame)?,
                has_body: frame.has_flag(FLAG_BODY),
            },
            Kind::Data => Message::Data {
                data: frame.payload,
                end,
            },
            Kind::FsResponse => Message::FsReply(parse(&frame)?),
            Kind::Error => Message::Error(parse(&frame)?),
            Kind::Shutdown => empty(frame, Message::Shutdown)?,
            Kind::ShutdownAck => empty(frame, Message::ShutdownAck)?,
            Kind::OutputAck => Message::OutputAck(parse(&frame)?),
            Kind::StdinAck => Message::StdinAck(parse(&frame)?),
            Kind::Resize => Message::Resize(parse(&frame)?),
            Kind::TcpConnect => Message::TcpConnect(parse(&frame)?),
            Kind::TcpConnected => empty(frame, Message::TcpConnected)?,
            Kind::TcpData => Message::TcpData {
                data: frame.payload,
                end,
            },
            Kind::TcpAck => Message::TcpAck(parse(&frame)?),
            Kind::TcpClose => empty(frame, Message::TcpClose)?,
            Kind::WatchStart => Message::WatchStart(parse(&frame)?),
            Kind::WatchEvents => Message::WatchEvents(parse(&frame)?),
            Kind::WatchAck => Message::WatchAck(parse(&frame)?),
            Kind::WatchStop => empty(frame, Message::WatchStop)?,
            Kind::WatchEnd => Message::WatchEnd(parse(&frame)?),
            Kind::ExecSignal => Message::ExecSignal(parse(&frame)?),
            Kind::ProcRequest => Message::ProcRequest(parse(&frame)?),
            Kind::ProcReply => Message::ProcReply(parse(&frame)?),
        };
        Ok(msg)
    }
}

fn json(id: u32, kind: Kind, value: &impl Serialize) -> Result<Frame, MessageError> {
    let payload =
        serde_json::to_vec(value).map_err(|source| MessageError::BadPayload { kind, source })?;
    Ok(Frame::new(id, kind, payload))
}

fn parse<T: DeserializeOwned>(frame: &Frame) -> Result<T, MessageError> {
    serde_json::from_slice(&frame.payload).map_err(|source| MessageError::BadPayload {
        kind: frame.kind,
        source,
    })
}

fn empty(frame: Frame, msg: Message) -> Result<Message, MessageError> {
    if frame.payload.is_empty() {
        Ok(msg)
    } else {
        Err(MessageError::UnexpectedPayload(frame.kind))
    }
}
