//! `POST /v1/feedback`'s decoder, as the handler runs it: JSON (with the NUL check), the
//! request type, its field checks, then the OpenAPI document's schema. Any bytes, no panic; an
//! accepted score is a whole number from 1 to 5.
#![no_main]

use arc_rec::api::body::{parse_json, typed};
use arc_rec::api::request_schemas::RequestSchemas;
use arc_rec::api::routes::feedback::FeedbackRequest;
use arc_rec::domain::OrgId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = parse_json(data) else {
        return;
    };
    let Ok(request) = typed::<FeedbackRequest>(&raw) else {
        return;
    };
    let org = OrgId::parse("acme").expect("a valid org id");
    if let Ok(record) = request.into_record(&org) {
        assert!(record.feedback_score.is_none_or(|s| (1..=5).contains(&s)));
        let _ = RequestSchemas::served()
            .expect("the document's schemas compile")
            .check("POST", "/v1/feedback", &raw);
    }
});
