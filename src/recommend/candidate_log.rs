//! The binary form in which the decision log keeps each decision's candidate set
//! (`decision_log.candidate_set`), and its decoder for off-policy evaluation.
//!
//! Every decision logs all the candidates it ranked (50 in `bench serve`), so this is most of
//! a decision's bytes. As JSONB it took about 7 kB of text to build, parse and compress, and
//! 2.1 kB on disk; this layout takes 18 bytes a candidate (900 bytes for 50), which shrinks
//! both the WAL each commit flushes and the dirty pages the kernel later writes back in bursts.
//!
//! Layout, little-endian:
//! - byte 0: format version, [`VERSION`]
//! - bytes 1-2: candidate count (u16)
//! - per candidate: type code (u8, [`type_code`]), expected reliability delta (f32), expected
//!   cost delta in USD per run (f32), then the id: tag 0 and 8 bytes for arc-rec's own
//!   `c-<16 hex digits>` ids, or tag 1, a u16 length and that many UTF-8 bytes for any other.
//!
//! The deltas are kept as f32: seven significant digits are far finer than the estimates they
//! hold. Decisions logged before this format keep their JSONB `candidates` column, which
//! [`decode_stored`] still reads.

use serde::{Deserialize, Serialize};

use crate::domain::RecommendationType;

/// A candidate as the decision log keeps it (off-policy evaluation recomputes target policies
/// from these).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggedCandidate {
    pub candidate_id: String,
    #[serde(rename = "type")]
    pub kind: RecommendationType,
    #[serde(default)]
    pub expected_reliability_delta: f64,
    #[serde(default)]
    pub expected_cost_delta_usd: f64,
}

/// The layout version written by [`encode`].
pub const VERSION: u8 = 1;

const TAG_HEX_ID: u8 = 0;
const TAG_TEXT_ID: u8 = 1;

/// Why a stored candidate set could not be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CandidateLogError {
    #[error("unknown candidate-set format version {0}")]
    Version(u8),
    #[error("candidate set is truncated at byte {0}")]
    Truncated(usize),
    #[error("unknown recommendation type code {0}")]
    TypeCode(u8),
    #[error("unknown candidate id tag {0}")]
    IdTag(u8),
    #[error("candidate id is not UTF-8")]
    IdEncoding,
    #[error("{0} bytes follow the last candidate")]
    TrailingBytes(usize),
    #[error("the decision logged no candidate set")]
    Missing,
    #[error("the JSON candidate set is malformed: {0}")]
    Json(String),
    #[error("too many candidates to log: {0}")]
    TooMany(usize),
    #[error("candidate id of {0} bytes is too long to log")]
    IdTooLong(usize),
}

/// A candidate as [`encode`] reads it: borrowed, so the request path copies nothing.
#[derive(Debug, Clone, Copy)]
pub struct CandidateEntry<'a> {
    pub candidate_id: &'a str,
    pub kind: RecommendationType,
    pub expected_reliability_delta: f64,
    pub expected_cost_delta_usd: f64,
}

/// The stable one-byte code of each type. Written to disk, so codes never change meaning; a new
/// type takes the next free code.
pub fn type_code(kind: RecommendationType) -> u8 {
    match kind {
        RecommendationType::Cheapest => 0,
        RecommendationType::HighestPerf => 1,
        RecommendationType::Balanced => 2,
        RecommendationType::ModelSwitch => 3,
        RecommendationType::RetryPolicy => 4,
        RecommendationType::TimeoutAdjustment => 5,
        RecommendationType::Temperature => 6,
        RecommendationType::ToolConfiguration => 7,
    }
}

fn type_of(code: u8) -> Option<RecommendationType> {
    RecommendationType::ALL
        .into_iter()
        .find(|t| type_code(*t) == code)
}

/// Encodes a candidate set in the layout above.
pub fn encode<'a>(
    candidates: impl ExactSizeIterator<Item = CandidateEntry<'a>>,
) -> Result<Vec<u8>, CandidateLogError> {
    let count = candidates.len();
    let count16 = u16::try_from(count).map_err(|_| CandidateLogError::TooMany(count))?;
    let mut out = Vec::with_capacity(3 + count * 18);
    out.push(VERSION);
    out.extend_from_slice(&count16.to_le_bytes());
    for c in candidates {
        out.push(type_code(c.kind));
        // Narrowing to f32 is the format (see the module comment).
        out.extend_from_slice(&(c.expected_reliability_delta as f32).to_le_bytes());
        out.extend_from_slice(&(c.expected_cost_delta_usd as f32).to_le_bytes());
        match hex_id(c.candidate_id) {
            Some(bytes) => {
                out.push(TAG_HEX_ID);
                out.extend_from_slice(&bytes);
            }
            None => {
                let len = c.candidate_id.len();
                let len16 = u16::try_from(len).map_err(|_| CandidateLogError::IdTooLong(len))?;
                out.push(TAG_TEXT_ID);
                out.extend_from_slice(&len16.to_le_bytes());
                out.extend_from_slice(c.candidate_id.as_bytes());
            }
        }
    }
    Ok(out)
}

/// The 8 bytes of a `c-<16 lowercase hex digits>` id (`Candidate::id_for`), if it is one.
fn hex_id(id: &str) -> Option<[u8; 8]> {
    let digits = id.strip_prefix("c-")?;
    if digits.len() != 16
        || !digits
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let mut bytes = [0u8; 8];
    hex::decode_to_slice(digits, &mut bytes).ok()?;
    Some(bytes)
}

/// Decodes a candidate set written by [`encode`].
pub fn decode(bytes: &[u8]) -> Result<Vec<LoggedCandidate>, CandidateLogError> {
    let mut reader = Reader { bytes, at: 0 };
    let version = reader.u8()?;
    if version != VERSION {
        return Err(CandidateLogError::Version(version));
    }
    let count = usize::from(reader.u16()?);
    // Every candidate takes at least 18 bytes, so a corrupt count cannot make us reserve much.
    let mut out = Vec::with_capacity(count.min(bytes.len() / 18));
    for _ in 0..count {
        let code = reader.u8()?;
        let kind = type_of(code).ok_or(CandidateLogError::TypeCode(code))?;
        let reliability = reader.f32()?;
        let cost = reader.f32()?;
        let candidate_id = match reader.u8()? {
            TAG_HEX_ID => format!("c-{}", hex::encode(reader.take(8)?)),
            TAG_TEXT_ID => {
                let len = usize::from(reader.u16()?);
                String::from_utf8(reader.take(len)?.to_vec())
                    .map_err(|_| CandidateLogError::IdEncoding)?
            }
            tag => return Err(CandidateLogError::IdTag(tag)),
        };
        out.push(LoggedCandidate {
            candidate_id,
            kind,
            expected_reliability_delta: f64::from(reliability),
            expected_cost_delta_usd: f64::from(cost),
        });
    }
    match bytes.len() - reader.at {
        0 => Ok(out),
        rest => Err(CandidateLogError::TrailingBytes(rest)),
    }
}

/// Decodes a decision's candidate set as stored: the binary column, or the JSONB column of
/// decisions logged before it existed.
pub fn decode_stored(
    binary: Option<&[u8]>,
    json: Option<serde_json::Value>,
) -> Result<Vec<LoggedCandidate>, CandidateLogError> {
    match (binary, json) {
        (Some(bytes), _) => decode(bytes),
        (None, Some(json)) => {
            serde_json::from_value(json).map_err(|e| CandidateLogError::Json(e.to_string()))
        }
        (None, None) => Err(CandidateLogError::Missing),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CandidateLogError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or(CandidateLogError::Truncated(self.at))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, CandidateLogError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, CandidateLogError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn f32(&mut self) -> Result<f32, CandidateLogError> {
        let b = self.take(4)?;
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn entry(id: &str, kind: RecommendationType, r: f64, c: f64) -> CandidateEntry<'_> {
        CandidateEntry {
            candidate_id: id,
            kind,
            expected_reliability_delta: r,
            expected_cost_delta_usd: c,
        }
    }

    #[test]
    fn fifty_own_ids_take_eighteen_bytes_each() {
        let ids: Vec<String> = (0..50u64).map(|i| format!("c-{:016x}", i * 7919)).collect();
        let bytes = encode(
            ids.iter()
                .map(|id| entry(id, RecommendationType::ModelSwitch, 0.1, -0.2)),
        )
        .expect("encodes");
        assert_eq!(bytes.len(), 3 + 50 * 18);
        let back = decode(&bytes).expect("decodes");
        assert_eq!(
            back.iter()
                .map(|c| c.candidate_id.as_str())
                .collect::<Vec<_>>(),
            ids
        );
    }

    #[test]
    fn other_ids_keep_their_text() {
        // Upper-case hex, a wrong length and free text all take the text form.
        let ids = ["c-ABCDEF0123456789", "c-0123", "model:cand/7 ü", ""];
        let bytes = encode(
            ids.iter()
                .map(|id| entry(id, RecommendationType::Temperature, 0.0, 0.0)),
        )
        .expect("encodes");
        let back: Vec<String> = decode(&bytes)
            .expect("decodes")
            .into_iter()
            .map(|c| c.candidate_id)
            .collect();
        assert_eq!(back, ids);
    }

    #[test]
    fn type_codes_are_pinned() {
        // Stored on disk: changing one would misread every logged decision.
        let codes: Vec<u8> = RecommendationType::ALL.into_iter().map(type_code).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(
            encode(
                [entry(
                    "c-00000000000000ff",
                    RecommendationType::Cheapest,
                    0.5,
                    -1.0
                )]
                .into_iter()
            )
            .expect("encodes"),
            [
                1, 1, 0, // version, count
                0, 0, 0, 0, 0x3f, 0, 0, 0x80, 0xbf, // cheapest, 0.5, -1.0
                0, 0, 0, 0, 0, 0, 0, 0, 0xff, // own id
            ]
        );
    }

    #[test]
    fn damaged_sets_are_errors() {
        let good = encode(
            [entry(
                "c-0000000000000001",
                RecommendationType::Balanced,
                0.1,
                0.2,
            )]
            .into_iter(),
        )
        .expect("encodes");
        assert_eq!(decode(&[]), Err(CandidateLogError::Truncated(0)));
        assert_eq!(decode(&[9, 0, 0]), Err(CandidateLogError::Version(9)));
        assert_eq!(
            decode(&good[..good.len() - 1]),
            Err(CandidateLogError::Truncated(13))
        );
        let mut extra = good.clone();
        extra.push(0);
        assert_eq!(decode(&extra), Err(CandidateLogError::TrailingBytes(1)));
        let mut bad_type = good.clone();
        bad_type[3] = 200;
        assert_eq!(decode(&bad_type), Err(CandidateLogError::TypeCode(200)));
        let mut bad_tag = good;
        bad_tag[12] = 7;
        assert_eq!(decode(&bad_tag), Err(CandidateLogError::IdTag(7)));
        // A count far beyond the bytes is truncation, not a large allocation.
        assert_eq!(
            decode(&[1, 0xff, 0xff]),
            Err(CandidateLogError::Truncated(3))
        );
    }

    #[test]
    fn decisions_logged_as_json_still_read() {
        let json = json!([{"candidate_id": "c-1", "type": "cheapest",
            "expected_reliability_delta": 0.25, "expected_cost_delta_usd": -0.5}]);
        let read = decode_stored(None, Some(json)).expect("reads");
        assert_eq!(read[0].kind, RecommendationType::Cheapest);
        assert_eq!(read[0].expected_cost_delta_usd, -0.5);
        assert_eq!(decode_stored(None, None), Err(CandidateLogError::Missing));
        assert!(matches!(
            decode_stored(None, Some(json!({"not": "a list"}))),
            Err(CandidateLogError::Json(_))
        ));
    }

    fn arb_kind() -> impl Strategy<Value = RecommendationType> {
        prop::sample::select(RecommendationType::ALL.to_vec())
    }

    proptest! {
        /// Oracle: the input itself, with the deltas rounded to f32.
        #[test]
        fn round_trips(
            raw in prop::collection::vec(
                (prop_oneof![
                    any::<u64>().prop_map(|v| format!("c-{v:016x}")),
                    ".{0,40}",
                ], arb_kind(), -10.0f64..10.0, -100.0f64..100.0),
                0..80,
            )
        ) {
            let bytes = encode(raw.iter().map(|(id, k, r, c)| entry(id, *k, *r, *c))).expect("encodes");
            let back = decode(&bytes).expect("decodes");
            prop_assert_eq!(back.len(), raw.len());
            for (b, (id, k, r, c)) in back.iter().zip(&raw) {
                prop_assert_eq!(&b.candidate_id, id);
                prop_assert_eq!(b.kind, *k);
                prop_assert_eq!(b.expected_reliability_delta, f64::from(*r as f32));
                prop_assert_eq!(b.expected_cost_delta_usd, f64::from(*c as f32));
            }
        }

        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }
    }
}
