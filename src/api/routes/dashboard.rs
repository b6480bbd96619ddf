//! `GET /dashboard` and its sign-in: the analysts' dashboard in a browser. The key comes from an
//! HttpOnly, SameSite=Strict cookie that `POST /dashboard/login` sets after checking it (or from
//! an `Authorization: Bearer` header, for scripts); it passes the same door as every API call
//! (`extract::admit`: rate limit and quota included). Only GETs read the cookie, so a page
//! elsewhere cannot make a browser change anything with it. Not in the OpenAPI document: these
//! are pages, not API.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, get, post, web};
use chrono::NaiveDate;

use crate::api::error::ApiError;
use crate::api::extract::{Caller, admit, bearer_token};
use crate::api::state::AppState;
use crate::auth::Permission;
use crate::dashboard::{self, Dashboard, Filters};
use crate::storage::analytics::Period;

/// Registers the pages (on the App itself: they stay out of the OpenAPI document).
pub fn configure(config: &mut web::ServiceConfig) {
    config
        .service(page)
        .service(login_form)
        .service(login)
        .service(logout);
}

/// The cookie holding the signed-in key.
pub const KEY_COOKIE: &str = "arc_rec_dashboard_key";
/// How long a sign-in lasts (the browser forgets the key after).
const SIGN_IN_SECONDS: u32 = 8 * 3600;

fn html(status: StatusCode, body: String) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        // Figures of one organization: never kept by a shared cache.
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header(("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'"))
        .body(body)
}

fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .finish()
}

/// The cookie that keeps `token` (or, with `None`, the one that deletes it).
fn key_cookie(request: &HttpRequest, token: Option<&str>) -> String {
    let secure = if request.connection_info().scheme() == "https" {
        "; Secure"
    } else {
        ""
    };
    match token {
        Some(token) => format!(
            "{KEY_COOKIE}={token}; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age={SIGN_IN_SECONDS}{secure}"
        ),
        None => {
            format!("{KEY_COOKIE}=; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age=0{secure}")
        }
    }
}

/// The key of a request: its bearer header, else its dashboard cookie.
fn key_of(request: &HttpRequest) -> Option<String> {
    bearer_token(request).or_else(|| {
        request
            .headers()
            .get_all(header::COOKIE)
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(name, value)| *name == KEY_COOKIE && !value.is_empty())
            .map(|(_, value)| value.to_owned())
    })
}

/// A key fit for a cookie value (what `arc-rec keys create` prints always is).
fn cookie_safe(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 256
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The filters of a dashboard URL: `org` (the key's own; the key sees no other), `since`,
/// `until` (YYYY-MM-DD, UTC; empty is unset, as a form sends it) and `cluster`. An error names
/// the parameter.
fn parse_filters(query: &str, own_org: &str) -> Result<Filters, (String, String)> {
    let mut since = None;
    let mut until = None;
    let mut cluster = None;
    let day = |name: &str, value: &str| {
        NaiveDate::parse_from_str(value, "%Y-%m-%d")
            .map(Some)
            .map_err(|e| {
                (
                    name.to_owned(),
                    format!("expected a day as YYYY-MM-DD ({e})"),
                )
            })
    };
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let value = value.trim();
        match name.as_ref() {
            "org" if value.is_empty() || value == own_org => {}
            "org" => {
                return Err((
                    "org".to_owned(),
                    format!("this key sees only organization {own_org}"),
                ));
            }
            _ if value.is_empty() => {}
            "since" => since = day("since", value)?,
            "until" => until = day("until", value)?,
            "cluster" => cluster = Some(value.to_owned()),
            other => {
                return Err((
                    other.to_owned(),
                    "unknown parameter (org, since, until or cluster)".to_owned(),
                ));
            }
        }
    }
    let period = Period::new(since, until).map_err(|e| ("since".to_owned(), e))?;
    Ok(Filters { period, cluster })
}

/// The dashboard of the key's organization (analyst or admin keys). Without a key: a redirect
/// to the sign-in form.
#[get("/dashboard")]
pub async fn page(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let Some(token) = key_of(&request) else {
        return Ok(see_other("/dashboard/login"));
    };
    let caller = match admit(&state, &token).await {
        Ok(caller) => caller,
        Err(ApiError::Unauthorized) => {
            // A revoked or mistyped key: forget it and ask again.
            let mut response = html(
                StatusCode::UNAUTHORIZED,
                dashboard::login_page(Some("This key is unknown or revoked; sign in again.")),
            );
            set_cookie(&mut response, &key_cookie(&request, None));
            return Ok(response);
        }
        Err(other) => return Err(other),
    };
    let principal = match caller.require(Permission::ReadAnalytics) {
        Ok(principal) => principal,
        Err(error) => {
            return Ok(html(
                StatusCode::FORBIDDEN,
                dashboard::error_page("Not allowed", &error.to_string()),
            ));
        }
    };
    let org = principal.org.as_str();
    let filters = match parse_filters(request.query_string(), org) {
        Ok(filters) => filters,
        Err((parameter, message)) => {
            return Ok(html(
                StatusCode::UNPROCESSABLE_ENTITY,
                dashboard::error_page("Bad filter", &format!("{parameter}: {message}")),
            ));
        }
    };
    let figures = Dashboard::load(&state.analytics_pool, Some(org), filters).await?;
    Ok(html(StatusCode::OK, dashboard::page(&figures)))
}

/// The sign-in form.
#[get("/dashboard/login")]
pub async fn login_form() -> HttpResponse {
    html(StatusCode::OK, dashboard::login_page(None))
}

/// Checks the key of the sign-in form (`key=...`, form-encoded) and keeps it in a cookie.
#[post("/dashboard/login")]
pub async fn login(
    request: HttpRequest,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let key = form_urlencoded::parse(&body)
        .find(|(name, _)| name == "key")
        .map(|(_, value)| value.trim().to_owned())
        .unwrap_or_default();
    let refuse =
        |status: StatusCode, message: &str| Ok(html(status, dashboard::login_page(Some(message))));
    if !cookie_safe(&key) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "key: paste an API key as `arc-rec keys create` printed it (arc_<id>_<secret>).",
        );
    }
    let caller: Caller = match admit(&state, &key).await {
        Ok(caller) => caller,
        Err(ApiError::Unauthorized) => {
            return refuse(StatusCode::UNAUTHORIZED, "key: unknown or revoked API key.");
        }
        Err(other) => return Err(other),
    };
    if let Err(error) = caller.require(Permission::ReadAnalytics) {
        return refuse(
            StatusCode::FORBIDDEN,
            &format!("key: {error}; the dashboard needs an analyst or admin key."),
        );
    }
    let mut response = see_other("/dashboard");
    set_cookie(&mut response, &key_cookie(&request, Some(&key)));
    Ok(response)
}

/// Forgets the signed-in key.
#[post("/dashboard/logout")]
pub async fn logout(request: HttpRequest) -> HttpResponse {
    let mut response = see_other("/dashboard/login");
    set_cookie(&mut response, &key_cookie(&request, None));
    response
}

fn set_cookie(response: &mut HttpResponse, cookie: &str) {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_form_values_and_name_the_bad_parameter() {
        let f = parse_filters("org=acme&since=2026-06-01&until=&cluster=c-1", "acme").unwrap();
        assert_eq!(f.period.since, NaiveDate::from_ymd_opt(2026, 6, 1));
        assert_eq!(f.period.until, None);
        assert_eq!(f.cluster.as_deref(), Some("c-1"));
        assert_eq!(parse_filters("", "acme").unwrap(), Filters::default());
        let name = |q: &str| parse_filters(q, "acme").unwrap_err().0;
        assert_eq!(name("since=06/01/2026"), "since");
        assert_eq!(name("until=2026-13-01"), "until");
        assert_eq!(name("since=2026-06-02&until=2026-06-01"), "since");
        assert_eq!(name("org=globex"), "org");
        assert_eq!(name("colour=red"), "colour");
    }

    #[test]
    fn only_plain_keys_become_cookies() {
        assert!(cookie_safe("arc_0123abcd_secretSECRET-9"));
        assert!(!cookie_safe(""));
        assert!(!cookie_safe("arc_x; Path=/"));
        assert!(!cookie_safe("arc x"));
    }
}
