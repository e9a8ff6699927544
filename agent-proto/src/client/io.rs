//! Async frame I/O for the client (the blocking twins live on [`Frame`]).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::frame::{Frame, FrameError, FrameHeader, HEADER_LEN};

/// Reads one frame; a clean EOF before a header is `FrameError::Closed`.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Frame, FrameError> {
    let mut head = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        let n = reader.read(&mut head[filled..]).await?;
        if n == 0 {
            if filled == 0 {
                return Err(FrameError::Closed);
            }
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        filled += n;
    }
    let header = FrameHeader::parse(&head)?;
    let mut payload = vec![0u8; header.len];
    reader.read_exact(&mut payload).await?;
    Ok(Frame {
        id: header.id,
        kind: header.kind,
        flags: header.flags,
        payload,
    })
}

pub(crate) async fn write_frame<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    frame: &Frame,
) -> Result<(), FrameError> {
    write_bytes(writer, &frame.to_bytes()?).await
}

/// Writes one frame already encoded (header and payload, [`Frame::to_bytes`]).
pub(crate) async fn write_bytes<W: AsyncWrite + Unpin + ?Sized>(
    writer: &mut W,
    bytes: &[u8],
) -> Result<(), FrameError> {
    writer.write_all(bytes).await?;
    writer.flush().await?;
    Ok(())
}
