//! The ingest line parser (`arc-rec ingest`, `POST /v1/trajectories`): any bytes, no panic; a
//! line it accepts writes back (`to_line`) to a line that parses to the same record.
#![no_main]

use arc_rec::domain::IngestRecord;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(record) = IngestRecord::parse_line(line) {
        let again = IngestRecord::parse_line(&record.to_line()).expect("a written line parses");
        assert_eq!(record, again, "the round trip changed the record");
    }
});
