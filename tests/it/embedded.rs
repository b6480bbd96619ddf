//! The embedded cluster as `EmbeddedPostgres` initialises and starts it.

use crate::helpers::{cluster_dir, fresh_database};

#[tokio::test]
async fn new_clusters_get_small_wal_segments() {
    let db = fresh_database().await;
    let size: String = sqlx::query_scalar("SHOW wal_segment_size")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        size,
        "1MB",
        "the test cluster under {} predates 1 MB segments; stop and remove it",
        cluster_dir().display()
    );
}
