//! `POST /v1/apply?dry_run=&prune=`: a whole quota set in one transaction.
//!
//! The body is a quota file as `sluice quota apply -f` reads it
//! (`{"quotas": [...]}` or a bare array; see [`crate::core::spec`]).
//! Without `prune`, quotas missing from the set are left alone; with
//! `prune=true` they are deleted, so the set becomes the whole truth.
//! `dry_run=true` answers the same difference without writing.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use crate::core::spec::{specs_from_json, SpecError};

use crate::root::state::RootState;
use crate::root::store::{ApplyDiff, ApplyOptions, QuotaUpdate};

use super::{json_response, named_field, read_body, ApiError};

/// Most names listed per kind of change in a reply; counts are always
/// complete.
pub const MAX_LISTED: usize = 1000;

/// Query of an apply.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyQuery {
    /// Report the difference, write nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Delete live quotas missing from the set.
    #[serde(default)]
    pub prune: bool,
}

#[derive(Serialize)]
struct Counts {
    created: usize,
    updated: usize,
    deleted: usize,
    unchanged: usize,
    /// Overrides written (new or changed); left out when none was, so a
    /// set without overrides reads as before.
    #[serde(skip_serializing_if = "is_zero")]
    overrides: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Serialize)]
struct ApplyReply {
    dry_run: bool,
    prune: bool,
    /// Epoch of the changes; null for a dry run or when nothing changed.
    epoch: Option<u64>,
    counts: Counts,
    created: Vec<String>,
    updated: Vec<QuotaUpdate>,
    deleted: Vec<String>,
    /// Overrides written, `template/key_hash`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    overrides: Vec<String>,
    /// Some list was cut at [`MAX_LISTED`].
    truncated: bool,
}

impl ApplyReply {
    fn new(query: &ApplyQuery, epoch: Option<u64>, diff: ApplyDiff) -> Self {
        let counts = Counts {
            created: diff.created.len(),
            updated: diff.updated.len(),
            deleted: diff.deleted.len(),
            unchanged: diff.unchanged,
            overrides: diff.overrides.len(),
        };
        let truncated = [
            counts.created,
            counts.updated,
            counts.deleted,
            counts.overrides,
        ]
        .iter()
        .any(|&n| n > MAX_LISTED);
        let mut diff = diff;
        diff.created.truncate(MAX_LISTED);
        diff.updated.truncate(MAX_LISTED);
        diff.deleted.truncate(MAX_LISTED);
        diff.overrides.truncate(MAX_LISTED);
        Self {
            dry_run: query.dry_run,
            prune: query.prune,
            epoch,
            counts,
            created: diff.created,
            updated: diff.updated,
            deleted: diff.deleted,
            overrides: diff.overrides,
            truncated,
        }
    }
}

/// Handles an apply.
pub async fn apply(
    State(state): State<Arc<RootState>>,
    query: Result<Query<ApplyQuery>, QueryRejection>,
    request: Request,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::malformed(None, e.body_text()))?;
    let body = read_body(request, &state).await?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::malformed(None, "the quota set is not UTF-8"))?;
    let specs = specs_from_json(text).map_err(|e| match e {
        SpecError::Parse(e) => {
            let mut field = e.path().unwrap_or_else(|| "quotas".into());
            // An unknown field is named only in the message.
            if let (None, Some(name)) = (e.place.field, named_field(&e.message)) {
                field = format!("{field}.{name}");
            }
            ApiError {
                quota: e.place.name.clone(),
                ..ApiError::malformed(Some(field), e.message_at())
            }
        }
        SpecError::Invalid { error, .. } => error.into(),
    })?;
    let options = ApplyOptions {
        prune: query.prune,
        dry_run: query.dry_run,
    };
    let outcome = if query.dry_run {
        state.read_only(state.store.apply(specs, options)).await?
    } else {
        state.write(state.store.apply(specs, options)).await?
    };
    if let Some(epoch) = outcome.epoch {
        let d = &outcome.diff;
        tracing::info!(
            epoch,
            created = d.created.len(),
            updated = d.updated.len(),
            deleted = d.deleted.len(),
            overrides = d.overrides.len(),
            "quota set applied"
        );
    }
    let reply = ApplyReply::new(&query, outcome.epoch, outcome.diff);
    Ok(json_response(StatusCode::OK, &reply))
}
