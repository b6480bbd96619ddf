//! `GET /dashboard`: the sign-in and its cookie, and the page's figures against a hand-written
//! SQL query, the API and the CLI on the same data.

use serde_json::{Value, json};

use crate::helpers::{TestApp, arc_rec};
use crate::serving::{recommend_contract, with_contract_data};

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn sign_in(app: &TestApp, client: &reqwest::Client, key: &str) -> reqwest::Response {
    client
        .post(format!("{}/dashboard/login", app.address))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("key={key}"))
        .send()
        .await
        .unwrap()
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_dashboard_asks_for_a_key_and_keeps_an_analysts_in_an_http_only_cookie() {
    let app = crate::helpers::spawn_app().await;
    let client = no_redirects();
    let get = |path: &str, cookie: Option<&str>| {
        let mut request = client.get(format!("{}{path}", app.address));
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        request.send()
    };
    let response = get("/dashboard", None).await.unwrap();
    assert_eq!(response.status(), 303);
    assert_eq!(header(&response, "location"), "/dashboard/login");
    let form = get("/dashboard/login", None).await.unwrap();
    assert_eq!(form.status(), 200);
    assert!(form.text().await.unwrap().contains(r#"name="key""#));

    // A platform key may not read analytics; an unknown key is refused; neither gets a cookie.
    let refused = sign_in(&app, &client, &app.platform_key).await;
    assert_eq!(refused.status(), 403);
    assert!(header(&refused, "set-cookie").is_empty());
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("analyst or admin key")
    );
    let unknown = sign_in(&app, &client, "arc_0000_nothing").await;
    assert_eq!(unknown.status(), 401);
    assert!(header(&unknown, "set-cookie").is_empty());
    let garbled = sign_in(&app, &client, "arc_x%3B%20Path%3D%2F").await;
    assert_eq!(garbled.status(), 401);

    let signed_in = sign_in(&app, &client, &app.analyst_key).await;
    assert_eq!(signed_in.status(), 303);
    assert_eq!(header(&signed_in, "location"), "/dashboard");
    let cookie = header(&signed_in, "set-cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/dashboard"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    let pair = cookie.split(';').next().unwrap().to_owned();
    let page = get("/dashboard", Some(&pair)).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(header(&page, "content-type").starts_with("text/html"));
    assert_eq!(header(&page, "cache-control"), "no-store");
    let html = page.text().await.unwrap();
    assert!(
        html.contains("acceptance of recommendations — acme"),
        "{html}"
    );
    assert!(
        html.contains("no data in this period"),
        "an empty log: {html}"
    );

    // Bad filters are named; another organization is not this key's to see.
    for (query, parameter) in [
        ("since=06/01/2026", "since"),
        ("since=2026-06-02&until=2026-06-01", "since"),
        ("org=globex", "org"),
        ("group=type", "group"),
    ] {
        let response = get(&format!("/dashboard?{query}"), Some(&pair))
            .await
            .unwrap();
        assert_eq!(response.status(), 422, "{query}");
        let text = response.text().await.unwrap();
        assert!(text.contains(&format!("{parameter}: ")), "{query}: {text}");
    }
    // A bearer header works as well (scripts); an admin key too.
    let page = app.get("/dashboard", Some(&app.admin_key)).await;
    assert_eq!(page.status(), 200);

    let out = client
        .post(format!("{}/dashboard/logout", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 303);
    assert!(header(&out, "set-cookie").contains("Max-Age=0"));
    // A cookie whose key is unknown (revoked, mistyped) is answered with the form and forgotten.
    let stale = get(
        "/dashboard",
        Some("arc_rec_dashboard_key=arc_0123456789abcdef_nothing"),
    )
    .await
    .unwrap();
    assert_eq!(stale.status(), 401);
    assert!(header(&stale, "set-cookie").contains("Max-Age=0"));
    assert!(stale.text().await.unwrap().contains("sign in again"));
}

/// The contract's data and nine served decisions with one answer each, about position 0 or 1
/// alternately, two in three accepted (each with a reported reliability delta of 0.1).
async fn nine_answered_decisions() -> TestApp {
    let app = with_contract_data().await;
    for i in 0..9 {
        let body = recommend_contract(&app).await;
        let outcome = if i % 3 == 0 { "rejected" } else { "accepted" };
        let feedback = json!({"event_id": body["event_id"], "recommendation_id": body["recommendations"][i % 2]["recommendation_id"], "outcome": outcome, "reliability_delta": 0.1});
        let status = app
            .post("/v1/feedback", Some(&app.platform_key), &feedback)
            .await
            .status();
        assert_eq!(status, 201);
    }
    app
}

/// Shown and accepted by recommendation type, most shown first, straight from the tables (not
/// from the views or the counts).
async fn acceptance_by_type_from_the_tables(app: &TestApp) -> Vec<(String, i64, i64)> {
    sqlx::query_as(
        "SELECT i.recommendation_type, count(*),
                count(*) FILTER (WHERE EXISTS (
                    SELECT 1 FROM feedback f WHERE f.org_id = i.org_id AND f.event_id = i.event_id
                      AND f.recommendation_id = i.recommendation_id
                      AND f.outcome IN ('accepted', 'applied')))
         FROM decision_items i WHERE i.org_id = 'acme'
         GROUP BY 1 ORDER BY 2 DESC, 1",
    )
    .fetch_all(app.db.pool())
    .await
    .unwrap()
}

/// `data-key`/`data-rate`/`data-count` of one chart's bars, by key.
fn chart_bars(html: &str, title: &str) -> Vec<(String, f64, i64)> {
    let start = html.find(&format!("<title>{title}</title>")).unwrap();
    let chart = &html[start..start + html[start..].find("</svg>").unwrap()];
    chart
        .split(r#"<g class="bar" "#)
        .skip(1)
        .map(|bar| {
            let attribute = |name: &str| {
                let from = bar.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
                bar[from..from + bar[from..].find('"').unwrap()].to_owned()
            };
            (
                attribute("data-key"),
                attribute("data-rate").parse().unwrap(),
                attribute("data-count").parse().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_dashboard_the_api_and_the_cli_agree_with_a_hand_written_query() {
    let app = nine_answered_decisions().await;
    let truth = acceptance_by_type_from_the_tables(&app).await;
    assert!(truth.iter().map(|t| t.2).sum::<i64>() == 6, "{truth:?}");
    let rate = |shown: i64, accepted: i64| accepted as f64 / shown as f64;

    let api: Value = app
        .get(
            "/v1/analytics/acceptance?group_by=type",
            Some(&app.analyst_key),
        )
        .await
        .json()
        .await
        .unwrap();
    let api: Vec<(String, i64, i64)> = api["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["shown"].as_i64().unwrap(),
                r["accepted"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(api, truth);

    let html = app
        .get("/dashboard", Some(&app.analyst_key))
        .await
        .text()
        .await
        .unwrap();
    let bars = chart_bars(&html, "Acceptance by recommendation type");
    assert_eq!(bars.len(), truth.len(), "{html}");
    for ((key, shown, accepted), (bar_key, bar_rate, bar_count)) in truth.iter().zip(&bars) {
        assert_eq!((key, shown), (bar_key, bar_count));
        assert!((rate(*shown, *accepted) - bar_rate).abs() < 1e-6);
        // The label a reader sees: the rate to one decimal, the count.
        let label = format!("{:.1} % [", 100.0 * rate(*shown, *accepted));
        assert!(html.contains(&label), "{label} in {html}");
    }
    let (shown, accepted) = truth.iter().fold((0, 0), |(s, a), t| (s + t.1, a + t.2));
    assert!(
        html.contains(&format!(
            "<strong>{accepted}</strong> of <strong>{shown}</strong> shown recommendations accepted"
        )),
        "{html}"
    );
    assert!(
        html.contains("+0.100"),
        "the reported reliability delta: {html}"
    );

    // The off-policy section: the live policy's logged top-1 acceptance, and the heuristic
    // order's SNIPS point estimate as the API computes it (the intervals' resamples differ).
    let (decisions, top_accepted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE EXISTS (
                    SELECT 1 FROM feedback f WHERE f.org_id = i.org_id AND f.event_id = i.event_id
                      AND f.recommendation_id = i.recommendation_id
                      AND f.outcome IN ('accepted', 'applied')))
         FROM decision_items i WHERE i.org_id = 'acme' AND i.position = 0",
    )
    .fetch_one(app.db.pool())
    .await
    .unwrap();
    let ope = chart_bars(
        &html,
        "Top-1 acceptance: the live policy and alternatives (SNIPS)",
    );
    assert_eq!(ope[0].0, "logged (the live policy)");
    assert_eq!(ope[0].2, decisions);
    assert!(
        (ope[0].1 - rate(decisions, top_accepted)).abs() < 1e-6,
        "{ope:?}"
    );
    let response = app
        .get("/v1/analytics/ope?policy=heuristic", Some(&app.analyst_key))
        .await;
    let status = response.status();
    let api: Value = response.json().await.unwrap();
    // Serving's picks are Thompson draws: when none of the nine logged tops is the one the
    // heuristic order would show, SNIPS has no weight to stand on, and both must say so.
    match ope.iter().find(|b| b.0 == "heuristic") {
        Some(heuristic) => {
            assert_eq!(status, 200, "{api}");
            let snips = api["snips"]["estimate"]
                .as_f64()
                .unwrap_or_else(|| panic!("no SNIPS estimate from the API: {api}"));
            assert!(
                (heuristic.1 - snips).abs() < 1e-6,
                "{heuristic:?} against {api}"
            );
        }
        None => {
            assert_eq!(status, 422, "{api}");
            assert!(api.to_string().contains("cannot evaluate"), "{api}");
            assert!(
                html.contains("<tr><td>heuristic</td><td colspan=\"3\">no estimate:"),
                "the dashboard's table says why the heuristic has no bar"
            );
        }
    }

    let output = arc_rec(&app.db.url)
        .args([
            "analytics",
            "acceptance",
            "--group-by",
            "type",
            "--org",
            "acme",
            "--format",
            "csv",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let cli: Vec<(String, i64, i64)> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .skip(1)
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            (
                fields[0].to_owned(),
                fields[1].parse().unwrap(),
                fields[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(cli, truth);

    // The cluster filter narrows all three the same way.
    let cluster: String = sqlx::query_scalar(
        "SELECT coalesce(cluster_id, 'unassigned') FROM decision_log WHERE org_id = 'acme' LIMIT 1",
    )
    .fetch_one(app.db.pool())
    .await
    .unwrap();
    let filtered = app
        .get(
            &format!("/dashboard?cluster={cluster}"),
            Some(&app.analyst_key),
        )
        .await;
    assert_eq!(filtered.status(), 200);
    assert!(
        filtered
            .text()
            .await
            .unwrap()
            .contains(&format!("cluster {cluster}"))
    );
    let none = app
        .get("/dashboard?cluster=no-such-cluster", Some(&app.analyst_key))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        none.contains("<strong>0</strong> of <strong>0</strong>"),
        "{none}"
    );
}

/// A real browser (headless Chromium, driven by `scripts/dashboard_browser_check.py`) opens the
/// dashboard, is sent to the sign-in form, signs in with an analyst key typed into it, and
/// renders charts whose labels and bar lengths are the database's numbers; the key's cookie is
/// out of the page scripts' reach (HttpOnly). The screenshot is kept in the target directory.
#[tokio::test]
async fn a_browser_signs_in_and_renders_the_charts_with_the_databases_numbers() {
    let app = nine_answered_decisions().await;
    let truth = acceptance_by_type_from_the_tables(&app).await;
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let _ = std::fs::remove_file(&screenshot);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/dashboard_browser_check.py"
    );
    let (address, key, shot) = (
        app.address.clone(),
        app.analyst_key.clone(),
        screenshot.clone(),
    );
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(address)
            .arg(key)
            .arg(shot)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the browser check failed (scripts/test.sh installs Debian's chromium): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let page: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(page["first_landing"], "/dashboard/login", "{page}");
    assert_eq!(page["path"], "/dashboard", "{page}");
    assert_eq!(page["cookie_visible_to_scripts"], "", "HttpOnly: {page}");
    let (shown, accepted) = truth.iter().fold((0, 0), |(s, a), t| (s + t.1, a + t.2));
    let headline = page["headline"].as_str().unwrap();
    assert!(
        headline.contains(&format!(
            "{accepted} of {shown} shown recommendations accepted"
        )),
        "{headline}"
    );
    let charts = page["charts"].as_array().unwrap();
    // Over time, by source, cluster, type and provider, and the off-policy estimates.
    assert_eq!(charts.len(), 6, "{page}");
    for chart in charts {
        assert!(chart["width"].as_f64().unwrap() > 100.0, "{chart}");
        assert!(chart["height"].as_f64().unwrap() > 50.0, "{chart}");
    }
    let by_type = charts
        .iter()
        .find(|c| c["title"] == "Acceptance by recommendation type")
        .unwrap();
    let bars = by_type["bars"].as_array().unwrap();
    assert_eq!(bars.len(), truth.len(), "{by_type}");
    for ((key, shown, accepted), bar) in truth.iter().zip(bars) {
        let rate = *accepted as f64 / *shown as f64;
        assert_eq!(bar["key"], key.as_str());
        assert_eq!(bar["count"], *shown);
        let label = bar["label"].as_str().unwrap();
        assert!(
            label.starts_with(&format!("{:.1} % [", 100.0 * rate))
                && label.ends_with(&format!("n {shown} shown")),
            "{label} for {accepted} of {shown}"
        );
        // Drawn to scale: 300 px for 100 %.
        let width = bar["bar_width"].as_f64().unwrap();
        assert!((width - 300.0 * rate).abs() < 0.06, "{width} for {rate}");
    }
    let over_time = charts
        .iter()
        .find(|c| c["title"] == "Acceptance per day and policy version (95 % bands)")
        .unwrap();
    assert!(over_time["points"].as_u64().unwrap() >= 1, "{over_time}");
    let png = std::fs::read(&screenshot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
}

/// `arc-rec report`: the summary page states the database's numbers, every chart is written as
/// SVG and PNG, and a cluster whose acceptance fell from two thirds to nothing in the last week
/// raises a drift alarm.
#[tokio::test]
async fn the_report_writes_the_figures_the_charts_and_a_drift_alarm() {
    let app = with_contract_data().await;
    for i in 0..24 {
        let body = recommend_contract(&app).await;
        // The first twelve decisions, moved below to two weeks ago, are mostly accepted; the
        // last twelve never.
        for position in 0..3 {
            let outcome = if i < 12 && position < 2 {
                "accepted"
            } else {
                "rejected"
            };
            let feedback = json!({"event_id": body["event_id"], "recommendation_id": body["recommendations"][position]["recommendation_id"], "outcome": outcome});
            let status = app
                .post("/v1/feedback", Some(&app.platform_key), &feedback)
                .await
                .status();
            assert_eq!(status, 201);
        }
    }
    sqlx::query(
        "UPDATE decision_log SET created_at = created_at - interval '14 days'
         WHERE event_id IN (SELECT event_id FROM decision_log ORDER BY created_at LIMIT 12)",
    )
    .execute(app.db.pool())
    .await
    .unwrap();
    sqlx::query("SELECT arc_rec_recount_acceptance()")
        .execute(app.db.pool())
        .await
        .unwrap();
    let (shown, accepted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE accepted) FROM analyst_shown_recommendations
         WHERE org_id = 'acme'",
    )
    .fetch_one(app.db.pool())
    .await
    .unwrap();
    assert_eq!(accepted, 24);
    let dir = tempfile::tempdir().unwrap();
    let output = arc_rec(&app.db.url)
        .args(["report", "--org", "acme", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!(
            "{accepted} of {shown} shown recommendations accepted"
        )),
        "{stdout}"
    );
    let html = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert!(
        html.contains(&format!(
            "<strong>{accepted}</strong> of <strong>{shown}</strong> shown recommendations accepted"
        )),
        "{html}"
    );
    assert!(
        html.contains("<strong>1</strong> alarm(s) among 1 cluster(s) tested"),
        "{html}"
    );
    assert!(html.contains("<strong>ALARM</strong>"), "{html}");
    assert!(
        stdout.contains("drift alarms: ") && !stdout.contains("drift alarms: none"),
        "{stdout}"
    );
    for stem in [
        "acceptance-over-time",
        "acceptance-by-source",
        "acceptance-by-cluster",
        "acceptance-by-type",
        "acceptance-by-provider",
        "off-policy",
    ] {
        let svg = std::fs::read_to_string(dir.path().join(format!("{stem}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "{stem}");
        let png = std::fs::read(dir.path().join(format!("{stem}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{stem}");
        assert!(html.contains(&format!("href=\"{stem}.png\"")), "{stem}");
    }
    // A bad period is refused naming the flag, and nothing is written.
    let output = arc_rec(&app.db.url)
        .args([
            "report",
            "--since",
            "2026-06-02",
            "--until",
            "2026-06-01",
            "--out",
        ])
        .arg(dir.path().join("bad"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--since"));
    assert!(!dir.path().join("bad").exists());
}
