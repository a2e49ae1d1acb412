//! `golden view [A B]`: two dumps side by side in the browser.
//!
//! A small web server on the loopback address only (127.0.0.1; a free port unless `--port`)
//! serves one page (`assets/view.{html,js,css}`, built into the binary: no network at run time).
//! Each side is a tensor file, a folder or an archive given on the command line, or uploaded from
//! the page's drop zones. Once both sides are there, they are compared by the same engine as
//! `golden diff` (`diff::run_with_progress`, one pair of tensors in memory at a time), and the
//! page lists the pairs in layer order with their figures, the first divergence marked. Opening a
//! pair reads its two tensors then — not at upload — lined up as the comparison lined them up
//! (`pair::align`: shards joined, B in A's shape and order), and the page asks for the values it
//! shows: a window per axis or of the flat order, at most [`MAX_CELLS`] at a time, each marked if
//! it is outside the tolerance; it may also ask where a value or a range occurs. A file changed
//! since the comparison read it (its length or time of change) is not shown beside the old
//! figures: the pair is refused with why (409) and the sides are compared again.
//!
//! Who may ask: the server answers only requests that name it as `127.0.0.1:PORT` or
//! `localhost:PORT` in their `Host` (a page of another site that points a name of its own at
//! 127.0.0.1 — DNS rebinding — sends its own name), that come from no other site (`Origin`,
//! `Sec-Fetch-Site`), and that carry this launch's token: the page's address holds it
//! (`/?token=…`, printed at start), and the page sends it with every request to `/api/` in the
//! `X-Golden-Token` header, which a page of another site can neither read nor send without asking
//! the server first (a CORS preflight, which it does not answer). A refused request gets a 403
//! that says why.
//!
//! Safety: uploads go into private temporary folders (`scratch.rs`) removed when replaced and at
//! exit (Ctrl-C included), are opened with the same limits as files on disk (`side.rs`,
//! `unpack.rs`: read budget, traversal, links, bombs; pickles that are not tensors are skipped and
//! named) and may be at most `--max-upload` bytes, refused by their length before a byte is
//! written; they go one at a time (another while one runs gets a 429). HTTP is axum's (on hyper): a malformed request
//! gets a 4xx, a request this server does not understand a 4xx with a message, and nothing a
//! request holds can stop the server. The page writes every name as text, never as markup.

use crate::diff::{Diff, Row};
use crate::mapping::Mapping;
use crate::pair::{self, Aligned, Options};
use crate::read::ReadOptions;
use crate::scratch::Scratch;
use crate::side::Side;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use golden_files::HostTensor;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{json, Value as JsonValue};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;

const PAGE: &str = include_str!("../assets/view.html");
const SCRIPT: &str = include_str!("../assets/view.js");
const STYLE: &str = include_str!("../assets/view.css");

/// Most values one request returns.
pub const MAX_CELLS: usize = 10_000;

/// What the server needs to know.
#[derive(Clone, Debug)]
pub struct Config {
    /// The port, or a free one.
    pub port: Option<u16>,
    /// How pairs are compared.
    pub options: Options,
    /// B's names mapped to A's.
    pub mapping: Mapping,
    /// The read budget of every file.
    pub read: ReadOptions,
    /// Most bytes one upload may have.
    pub max_upload: u64,
}

/// A side, loaded.
struct Loaded {
    side: Arc<Side>,
    /// What the page calls it: the path given, or the uploaded file's name.
    name: String,
    /// The uploaded file's private folder.
    _upload: Option<Scratch>,
}

enum Comparison {
    Waiting,
    Running { done: usize, total: usize },
    Ready(Arc<Diff>, Arc<Stamps>),
    Failed(String),
}

/// What a file was when the comparison began to read it: its length and its time of change.
type Stamp = Option<(u64, std::time::SystemTime)>;

/// The stamps of both sides' files, taken before the comparison read them: a pair opened later
/// is read from the same files, or refused (its values would not be those of its figures).
type Stamps = std::collections::HashMap<PathBuf, Stamp>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

struct App {
    sides: [Option<Loaded>; 2],
    /// Bumped whenever a side changes: a comparison of older sides is dropped.
    generation: u64,
    comparison: Comparison,
    /// The pair last opened: generation, row, its tensors lined up.
    opened: Option<(u64, usize, Arc<Aligned>)>,
}

struct Server {
    config: Config,
    app: Mutex<App>,
    /// This launch's token (hex).
    token: String,
    /// The port it listens on.
    port: u16,
    /// Held while an upload runs: uploads go one at a time.
    uploading: tokio::sync::Semaphore,
}

/// The header the page sends the token in.
pub const TOKEN_HEADER: &str = "x-golden-token";

/// A new launch's token: 24 random bytes, in hex.
fn new_token() -> Result<String, String> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| format!("cannot draw a token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether two strings are equal, in a time that does not depend on where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Server {
    /// Why a request may not be answered, if it may not: see the module's doc.
    fn refusal(&self, uri: &Uri, headers: &HeaderMap) -> Option<String> {
        let port = self.port;
        let text = |name: header::HeaderName| {
            headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        let host = text(header::HOST).unwrap_or_default();
        let ours = [format!("127.0.0.1:{port}"), format!("localhost:{port}")];
        if !ours.contains(&host.to_ascii_lowercase()) {
            return Some(format!(
                "golden view answers only requests for http://127.0.0.1:{port}/ or                  http://localhost:{port}/, and this one names the Host `{host}`: a page of                  another site that points a name of its own at this machine (DNS rebinding)                  is refused; open the address golden view printed"
            ));
        }
        if let Some(origin) = text(header::ORIGIN) {
            if origin.to_ascii_lowercase() != format!("http://{}", host.to_ascii_lowercase()) {
                return Some(format!(
                    "a request from another site (Origin `{origin}`) is refused: only golden                      view's own page may ask"
                ));
            }
        }
        if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site")) {
            if !matches!(site.as_str(), "same-origin" | "none") {
                return Some(format!(
                    "a request from another site (Sec-Fetch-Site `{site}`) is refused: only                      golden view's own page may ask"
                ));
            }
        }
        let path = uri.path();
        let token = if path == "/" {
            // The page: its address carries the token.
            uri.query()
                .into_iter()
                .flat_map(|q| q.split('&'))
                .find_map(|kv| kv.strip_prefix("token="))
                .map(str::to_string)
                .or_else(|| text(header::HeaderName::from_static(TOKEN_HEADER)))
        } else if path.starts_with("/api/") {
            text(header::HeaderName::from_static(TOKEN_HEADER))
        } else {
            // The page's script and style: the same for everyone, nothing of the dumps.
            return None;
        };
        match token {
            Some(t) if same_secret(&t, &self.token) => None,
            Some(_) => Some(
                "this launch's token is not the one given: open the address golden view                  printed (each launch has its own)"
                    .into(),
            ),
            None => Some(
                "no token: open the address golden view printed, which carries this launch's                  token"
                    .into(),
            ),
        }
    }
}

/// Every request passes here first: see [`Server::refusal`].
async fn guard(State(server): State<Shared>, request: Request, next: Next) -> Response {
    match server.refusal(request.uri(), request.headers()) {
        None => next.run(request).await,
        Some(why) if request.uri().path().starts_with("/api/") => error(StatusCode::FORBIDDEN, why),
        Some(why) => (
            StatusCode::FORBIDDEN,
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            format!("golden view: {why}\n"),
        )
            .into_response(),
    }
}

type Shared = Arc<Server>;

fn lock(s: &Server) -> std::sync::MutexGuard<'_, App> {
    s.app.lock().unwrap_or_else(|p| p.into_inner())
}

/// An error for the page: a status and a message.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// Start comparing the two sides, if both are there (on a thread of its own).
fn compare_sides(server: &Shared) {
    let mut app = lock(server);
    app.generation += 1;
    app.opened = None;
    let generation = app.generation;
    let (Some(a), Some(b)) = (&app.sides[0], &app.sides[1]) else {
        app.comparison = Comparison::Waiting;
        return;
    };
    let (a, b) = (a.side.clone(), b.side.clone());
    app.comparison = Comparison::Running { done: 0, total: 0 };
    drop(app);
    let stamps: Arc<Stamps> = Arc::new(
        a.files
            .iter()
            .chain(&b.files)
            .map(|(_, path)| (path.clone(), stamp(path)))
            .collect(),
    );
    let server = server.clone();
    std::thread::spawn(move || {
        let progress = |done: usize, total: usize| {
            let mut app = lock(&server);
            if app.generation == generation {
                app.comparison = Comparison::Running { done, total };
            }
        };
        let config = &server.config;
        let result = crate::diff::run_with_progress(
            [&a, &b],
            config.options,
            &config.mapping,
            &config.read,
            &progress,
        );
        let mut app = lock(&server);
        if app.generation == generation {
            app.comparison = match result {
                Ok(d) => Comparison::Ready(Arc::new(d), stamps),
                Err(e) => Comparison::Failed(e),
            };
        }
    });
}

fn side_json(l: &Option<Loaded>) -> JsonValue {
    match l {
        None => JsonValue::Null,
        Some(l) => json!({
            "name": l.name,
            "form": l.side.describe(),
            "files": l.side.files.len(),
            "notes": l.side.notes,
        }),
    }
}

async fn state(State(server): State<Shared>) -> Response {
    let app = lock(&server);
    let (status, progress, error, diff) = match &app.comparison {
        Comparison::Waiting => ("waiting", json!(null), JsonValue::Null, JsonValue::Null),
        Comparison::Running { done, total } => (
            "comparing",
            json!([done, total]),
            JsonValue::Null,
            JsonValue::Null,
        ),
        Comparison::Ready(d, _) => ("ready", JsonValue::Null, JsonValue::Null, d.json()),
        Comparison::Failed(e) => ("failed", JsonValue::Null, json!(e), JsonValue::Null),
    };
    let tolerance = server.config.options.tolerance;
    Json(json!({
        "generation": app.generation,
        "sides": [side_json(&app.sides[0]), side_json(&app.sides[1])],
        "status": status,
        "progress": progress,
        "error": error,
        "diff": diff,
        "tolerance": {"atol": tolerance.atol, "rtol": tolerance.rtol},
        "strict_shapes": server.config.options.strict_shapes,
    }))
    .into_response()
}

#[derive(Deserialize)]
struct UploadQuery {
    side: String,
    name: String,
}

/// An upload's file name, made safe: its last part, letters, digits and `._-` only.
fn safe_name(name: &str) -> Option<String> {
    let last = name.rsplit(['/', '\\']).next().unwrap_or_default();
    let clean: String = last
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect();
    let clean = clean.trim_start_matches('.').to_string();
    (!clean.is_empty()).then_some(clean)
}

fn side_index(side: &str) -> Option<usize> {
    match side {
        "a" | "A" => Some(0),
        "b" | "B" => Some(1),
        _ => None,
    }
}

async fn upload(
    State(server): State<Shared>,
    Query(q): Query<UploadQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(index) = side_index(&q.side) else {
        return error(StatusCode::BAD_REQUEST, "side must be `a` or `b`");
    };
    let Some(name) = safe_name(&q.name) else {
        return error(StatusCode::BAD_REQUEST, "the upload has no file name");
    };
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "`{name}` is larger than {} (golden view --max-upload SIZE)",
                golden_files::budget::size(server.config.max_upload)
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > server.config.max_upload) {
        return too_large();
    }
    let Ok(_uploading) = server.uploading.try_acquire() else {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            "uploads go one at a time: another one is running; try again when it is done",
        );
    };
    let scratch = match Scratch::new("upload") {
        Ok(s) => s,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    let path = scratch.path().join(&name);
    let mut file = match tokio::fs::File::create(&path).await {
        Ok(f) => f,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let (mut body, mut written) = (body, 0u64);
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("the upload broke off: {e}"),
                )
            }
        };
        if let Ok(data) = frame.into_data() {
            written += data.len() as u64;
            if written > server.config.max_upload {
                return too_large();
            }
            if let Err(e) = file.write_all(&data).await {
                return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
            }
        }
    }
    if let Err(e) = file.flush().await {
        return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    }
    drop(file);
    let read = server.config.read.clone();
    let opened = tokio::task::spawn_blocking(move || {
        let side = Side::open_as(&path, &name, Path::new(&name), &read)?;
        if side.is_folder() {
            // Unpacked: the archive itself is no longer needed.
            let _ = std::fs::remove_file(&path);
        }
        Ok::<_, String>((side, name, scratch))
    })
    .await;
    let (side, name, scratch) = match opened {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => return error(StatusCode::UNPROCESSABLE_ENTITY, e),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let files = side.files.len();
    lock(&server).sides[index] = Some(Loaded {
        side: Arc::new(side),
        name: name.clone(),
        _upload: Some(scratch),
    });
    compare_sides(&server);
    Json(json!({"side": q.side, "name": name, "files": files})).into_response()
}

/// The row `row` of the current comparison, lined up (read now, then kept until another opens).
async fn aligned(server: &Shared, row: usize) -> Result<(Arc<Diff>, Arc<Aligned>), Response> {
    let (generation, diff, stamps, cached) = {
        let app = lock(server);
        let Comparison::Ready(diff, stamps) = &app.comparison else {
            return Err(error(StatusCode::CONFLICT, "the comparison is not ready"));
        };
        let cached = app
            .opened
            .as_ref()
            .filter(|(g, r, _)| *g == app.generation && *r == row)
            .map(|(_, _, a)| a.clone());
        (app.generation, diff.clone(), stamps.clone(), cached)
    };
    let Some(r) = diff.rows.get(row) else {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!("no row {row}: the comparison has {}", diff.rows.len()),
        ));
    };
    if let Some(a) = cached {
        return Ok((diff, a));
    }
    if r.source.a.is_empty() || r.source.b.is_empty() {
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("`{}` is on one side only", r.name),
        ));
    }
    let (r, read, tol) = (
        r.clone(),
        server.config.read.clone(),
        server.config.options.tolerance,
    );
    let lined = tokio::task::spawn_blocking(move || line_up(&r, &read, tol, &stamps))
        .await
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| match e {
            Unread::Changed(path) => {
                // Compared again, unless a newer comparison already runs.
                if lock(server).generation == generation {
                    compare_sides(server);
                }
                error(
                    StatusCode::CONFLICT,
                    format!(
                        "{} changed since the comparison read it: its values would not be those \
                         of the figures shown, so the two sides are compared again",
                        path.display()
                    ),
                )
            }
            Unread::Error(e) => error(StatusCode::UNPROCESSABLE_ENTITY, e),
        })?;
    let lined = Arc::new(lined);
    let mut app = lock(server);
    if app.generation == generation {
        app.opened = Some((generation, row, lined.clone()));
    }
    Ok((diff, lined))
}

/// Why a row's tensors were not read.
enum Unread {
    /// A file is not what the comparison read.
    Changed(PathBuf),
    /// A file could not be read, or the pair not lined up.
    Error(String),
}

/// Read a row's tensors and line them up as its comparison did, from the files it read (`stamps`).
fn line_up(
    r: &Row,
    read: &ReadOptions,
    tol: pair::Tolerance,
    stamps: &Stamps,
) -> Result<Aligned, Unread> {
    let load = |files: &[(PathBuf, String)]| -> Result<Vec<HostTensor>, Unread> {
        files
            .iter()
            .map(|(path, name)| {
                let same = || stamps.get(path).is_none_or(|s| *s == stamp(path));
                if !same() {
                    return Err(Unread::Changed(path.clone()));
                }
                let mut f = read.open(path).map_err(Unread::Error)?;
                let i = if f.entries().len() == 1 {
                    0
                } else {
                    f.find(name).ok_or_else(|| {
                        Unread::Error(format!("{}: no tensor `{name}`", path.display()))
                    })?
                };
                let t = f
                    .load(i)
                    .map_err(|e| Unread::Error(format!("{}: {e}", path.display())))?;
                // Changed while it was read: not the comparison's either.
                if !same() {
                    return Err(Unread::Changed(path.clone()));
                }
                Ok(t)
            })
            .collect()
    };
    let (a, b) = (load(&r.source.a)?, load(&r.source.b)?);
    pair::align(&a, &b, r.explained(), tol).map_err(Unread::Error)
}

#[derive(Deserialize)]
struct ValuesQuery {
    row: usize,
    /// Per axis `start` (comma-separated), or the flat start with `flat`.
    start: Option<String>,
    /// Per axis `end` (exclusive), or the flat end with `flat`.
    end: Option<String>,
    /// Whether start and end are flat indices.
    #[serde(default)]
    flat: bool,
}

fn numbers(text: &Option<String>, what: &str) -> Result<Vec<usize>, String> {
    match text.as_deref().map(str::trim) {
        None | Some("") => Ok(Vec::new()),
        Some(t) => t
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("{what}: `{x}` is not an index (0, 1, 2, …)"))
            })
            .collect(),
    }
}

/// A value for the page: a number, or `NaN`/`inf`/`-inf` as text.
fn value(x: f64) -> JsonValue {
    if x.is_finite() {
        json!(x)
    } else {
        json!(x.to_string())
    }
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for k in (0..shape.len()).rev() {
        if shape[k] > 0 {
            index[k] = flat % shape[k];
            flat /= shape[k];
        }
    }
    index
}

fn ravel(index: &[usize], shape: &[usize]) -> usize {
    index.iter().zip(shape).fold(0, |acc, (i, d)| acc * d + i)
}

async fn values(State(server): State<Shared>, Query(q): Query<ValuesQuery>) -> Response {
    let (start, end) = match (numbers(&q.start, "start"), numbers(&q.end, "end")) {
        (Ok(s), Ok(e)) => (s, e),
        (Err(e), _) | (_, Err(e)) => return error(StatusCode::BAD_REQUEST, e),
    };
    let (diff, t) = match aligned(&server, q.row).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let shape = t.a.shape.clone();
    let numel = t.a.numel();
    // The flat indices shown: a window of the flat order, or a box of one range per axis.
    let mut flats: Vec<usize> = Vec::new();
    let mut truncated = false;
    let (box_start, box_end): (Vec<usize>, Vec<usize>);
    if q.flat || shape.is_empty() {
        let s = start.first().copied().unwrap_or(0).min(numel);
        let e = end.first().copied().unwrap_or(s + 10).clamp(s, numel);
        truncated = e - s > MAX_CELLS;
        flats.extend(s..e.min(s + MAX_CELLS));
        box_start = vec![s];
        box_end = vec![e];
    } else {
        if start.len() > shape.len() || end.len() > shape.len() {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the tensor has {} axes ({shape:?})", shape.len()),
            );
        }
        let lo: Vec<usize> = (0..shape.len())
            .map(|k| start.get(k).copied().unwrap_or(0).min(shape[k]))
            .collect();
        let hi: Vec<usize> = (0..shape.len())
            .map(|k| {
                end.get(k)
                    .copied()
                    .unwrap_or(shape[k])
                    .clamp(lo[k], shape[k])
            })
            .collect();
        if lo.iter().zip(&hi).all(|(l, h)| h > l) {
            let mut index = lo.clone();
            loop {
                if flats.len() == MAX_CELLS {
                    truncated = true;
                    break;
                }
                flats.push(ravel(&index, &shape));
                let mut k = shape.len();
                let mut carried = true;
                while k > 0 && carried {
                    k -= 1;
                    index[k] += 1;
                    if index[k] < hi[k] {
                        carried = false;
                    } else {
                        index[k] = lo[k];
                    }
                }
                if carried {
                    break;
                }
            }
        }
        box_start = lo;
        box_end = hi;
    }
    let cells: Vec<JsonValue> = flats
        .iter()
        .map(|&i| {
            let (x, y) = (t.a.f64_at(i), t.b.f64_at(i));
            json!([
                i,
                unravel(i, &shape),
                value(x),
                value(y),
                !t.rule.admits(x, y)
            ])
        })
        .collect();
    let r = &diff.rows[q.row];
    Json(json!({
        "row": q.row,
        "name": r.name,
        "shape": shape,
        "numel": numel,
        "a_dtype": t.a.dtype.name(),
        "b_dtype": t.b.dtype.name(),
        "b_shape": r.b.as_ref().map(|(s, _)| s.clone()),
        "note": r.explained().map(|e| e.note()),
        "rule": pair::rule_text(t.rule),
        "start": box_start,
        "end": box_end,
        "flat": q.flat || shape.is_empty(),
        "truncated": truncated,
        "cells": cells,
    }))
    .into_response()
}

#[derive(Deserialize)]
struct FindQuery {
    row: usize,
    /// `a`, `b` or `either`.
    side: String,
    /// The value, or the range's low end.
    lo: f64,
    /// The range's high end (none: find the value, within the tolerance).
    hi: Option<f64>,
    /// Search after this flat index (wrapping around); none: from the start.
    after: Option<usize>,
}

async fn find(State(server): State<Shared>, Query(q): Query<FindQuery>) -> Response {
    let sides: &[usize] = match q.side.as_str() {
        "a" | "A" => &[0],
        "b" | "B" => &[1],
        "either" => &[0, 1],
        _ => return error(StatusCode::BAD_REQUEST, "side must be `a`, `b` or `either`"),
    };
    if q.lo.is_nan() || q.hi.is_some_and(f64::is_nan) {
        return error(
            StatusCode::BAD_REQUEST,
            "a value or range of numbers, not NaN",
        );
    }
    let (_, t) = match aligned(&server, q.row).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let sides = sides.to_vec();
    let found = tokio::task::spawn_blocking(move || {
        let n = t.a.numel();
        // After any index, even the largest there is: wrapped into the tensor first.
        let first = q.after.map_or(0, |a| a % n.max(1) + 1);
        let hit = |x: f64| match q.hi {
            Some(hi) => x >= q.lo.min(hi) && x <= q.lo.max(hi),
            None => t.rule.admits(q.lo, x),
        };
        (0..n)
            .map(|k| (first + k) % n.max(1))
            .find(|&i| {
                sides.iter().any(|&s| {
                    let x = if s == 0 { t.a.f64_at(i) } else { t.b.f64_at(i) };
                    hit(x)
                })
            })
            .map(|i| (i, unravel(i, &t.a.shape)))
    })
    .await;
    match found {
        Ok(Some((i, index))) => Json(json!({"flat": i, "index": index})).into_response(),
        Ok(None) => Json(json!({"flat": null})).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such page")
}

/// The routes of the server.
fn router(server: Shared) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/view.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/view.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route("/api/state", get(state))
        .route("/api/upload", post(upload))
        .route("/api/values", get(values))
        .route("/api/find", get(find))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(server.clone(), guard))
        .with_state(server)
}

/// The two sides of a failing check's artifacts folder (`target/golden/failures/<crate>/<check>/`):
/// the reference's and the port's outputs — their trace points, numbered in the reference's
/// order (`trace/reference`, `trace/port`), when the check was traced.
pub fn artifact_sides(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    ["trace", ""].iter().find_map(|sub| {
        let base = dir.join(sub);
        let (r, p) = (base.join("reference"), base.join("port"));
        (r.is_dir() && p.is_dir()).then_some((r, p))
    })
}

/// Serve the page until the process is stopped; `sides` are the sides given on the command line
/// (one folder alone may be a failure's artifacts: [`artifact_sides`]).
/// Prints the address on stdout once it listens.
pub fn run(sides: [Option<&Path>; 2], config: Config) -> Result<(), String> {
    let artifacts = match sides {
        [Some(dir), None] => artifact_sides(dir),
        _ => None,
    };
    let sides = match &artifacts {
        Some((r, p)) => [Some(r.as_path()), Some(p.as_path())],
        None => sides,
    };
    let mut loaded: [Option<Loaded>; 2] = [None, None];
    for (k, path) in sides.iter().enumerate() {
        if let Some(path) = path {
            let side = Side::open(path, &config.read)?;
            loaded[k] = Some(Loaded {
                side: Arc::new(side),
                name: path.display().to_string(),
                _upload: None,
            });
        }
    }
    let token = new_token()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    runtime.block_on(async move {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], config.port.unwrap_or(0)));
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|e| format!("cannot listen on {address}: {e}"))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        let server: Shared = Arc::new(Server {
            config: config.clone(),
            app: Mutex::new(App {
                sides: loaded,
                generation: 0,
                comparison: Comparison::Waiting,
                opened: None,
            }),
            token: token.clone(),
            port: bound.port(),
            uploading: tokio::sync::Semaphore::new(1),
        });
        compare_sides(&server);
        {
            use std::io::Write as _;
            let mut out = std::io::stdout();
            let _ = writeln!(
                out,
                "golden view: http://{bound}/?token={token} (Ctrl-C stops it)"
            );
            let _ = out.flush();
        }
        axum::serve(listener, router(server))
            .await
            .map_err(|e| format!("the server stopped: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_names_are_made_safe() {
        assert_eq!(
            safe_name("model_a.tar.gz").as_deref(),
            Some("model_a.tar.gz")
        );
        assert_eq!(safe_name("../../etc/passwd").as_deref(), Some("passwd"));
        assert_eq!(
            safe_name("C:\\x\\a b<c>.zip").as_deref(),
            Some("a_b_c_.zip")
        );
        assert_eq!(safe_name("..."), None);
        assert_eq!(safe_name(""), None);
        assert_eq!(ravel(&unravel(37, &[2, 3, 7]), &[2, 3, 7]), 37);
    }
}
