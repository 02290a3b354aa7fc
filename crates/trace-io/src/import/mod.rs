//! Importers: real-world routing logs to [`crate::TraceData`].
//!
//! - [`esft`]: the ESFT expert-score layout (DeepSeek-V2-Lite, one text file per domain and layer).

pub mod esft;
