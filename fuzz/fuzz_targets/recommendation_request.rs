//! `POST /v1/recommendations`'s decoder, as the handler runs it: JSON (with the NUL check), the
//! request type, its field checks, then the OpenAPI document's schema. Any bytes, no panic.
#![no_main]

use arc_rec::api::body::{parse_json, typed};
use arc_rec::api::request_schemas::RequestSchemas;
use arc_rec::api::routes::recommendations::RecommendationRequest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = parse_json(data) else {
        return;
    };
    let Ok(request) = typed::<RecommendationRequest>(&raw) else {
        return;
    };
    if request.into_query().is_ok() {
        let _ = RequestSchemas::served()
            .expect("the document's schemas compile")
            .check("POST", "/v1/recommendations", &raw);
    }
});
