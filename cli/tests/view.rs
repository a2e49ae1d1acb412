//! `golden view` as a server: uploads of real PyTorch dumps (archived) compared by the same
//! engine as `golden diff`, the values of a pair read on demand and marked against the
//! tolerance, finds, a 4xx for every malformed or senseless request without the server going
//! down, hostile uploads left out by name, nothing left behind after Ctrl-C, and two large
//! archives compared in bounded memory.

mod common;

use common::{archive, make_dumps, run_python, Dir, Server};
use serde_json::Value as Json;
use std::path::Path;

fn json(body: &str) -> Json {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

#[test]
fn uploads_compare_like_diff_and_bad_requests_get_a_4xx() {
    let d = Dir::new("view");
    let (a, b) = make_dumps(d.path());
    let (za, zb) = (
        d.path().join("model_a.zip"),
        d.path().join("model_b.tar.gz"),
    );
    archive(&a, &za);
    archive(&b, &zb);
    let evil = d.path().join("evil.tar");
    run_python(
        r#"
import os, sys, tarfile
src, evil = sys.argv[1], sys.argv[2]
with tarfile.open(evil, "w") as t:
    t.add(os.path.join(src, "0_post_attn.pth"), "0_post_attn.pth")
    t.add(os.path.join(src, "0_post_mlp.pth"), "../outside.pth")
"#,
        &[&a, &evil],
    );
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let server = Server::start(&["--max-upload", "1MiB"], &tmp);

    // The page and its assets, from the binary.
    let (status, page) = server.get("/");
    assert_eq!(status, 200);
    assert!(
        page.contains("<title>golden view</title>") && !page.contains("http"),
        "{page}"
    );
    assert_eq!(server.get("/view.js").0, 200);
    assert_eq!(server.get("/view.css").0, 200);
    // Malformed and senseless requests: a 4xx each, and the server goes on.
    assert_eq!(server.raw(b"GARBAGE\r\n\r\n").0, 400);
    assert_eq!(
        server
            .raw(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
            .0,
        400
    );
    assert_eq!(server.get("/nothing/here").0, 404);
    assert_eq!(server.get("/api/values?row=abc").0, 400);
    assert_eq!(
        server.get("/api/values?row=0").0,
        409,
        "nothing to compare yet"
    );
    assert_eq!(server.get("/api/find?row=0&side=a&lo=x").0, 400);
    assert_eq!(server.post("/api/upload?side=c&name=x.zip", b"1").0, 400);
    assert_eq!(server.post("/api/upload?side=a", b"1").0, 400);
    assert_eq!(server.post("/api/upload?side=a&name=..", b"1").0, 400);
    let (status, body) = server.post("/api/upload?side=a&name=broken.tar.gz", b"not gzip at all");
    assert_eq!(status, 422, "{body}");
    assert!(
        json(&body)["error"]
            .as_str()
            .unwrap()
            .contains("not a readable tar archive"),
        "{body}"
    );
    let (status, body) = server.post("/api/upload?side=a&name=big.zip", &vec![0u8; 2 << 20]);
    assert_eq!(status, 413, "{body}");
    // A hostile archive: what would leave it is left out, by name.
    let (status, body) = server.post(
        "/api/upload?side=a&name=evil.tar",
        &std::fs::read(&evil).unwrap(),
    );
    assert_eq!(status, 200, "{body}");
    let state = server.settled_state();
    assert_eq!(state["status"], "waiting");
    let notes = state["sides"][0]["notes"].to_string();
    assert!(
        notes.contains("left out `../outside.pth`: its path leaves the archive"),
        "{notes}"
    );
    assert!(!d.path().join("outside.pth").exists() && !tmp.join("outside.pth").exists());

    // Two archives: compared as golden diff compares them.
    for (side, file) in [("a", &za), ("b", &zb)] {
        let name = file.file_name().unwrap().to_str().unwrap();
        let (status, body) = server.post(
            &format!("/api/upload?side={side}&name={name}"),
            &std::fs::read(file).unwrap(),
        );
        assert_eq!(status, 200, "{body}");
    }
    let state = server.settled_state();
    assert_eq!(state["status"], "ready", "{state}");
    let diff = golden_cli::diff::run(&za, &zb, Default::default(), &Default::default()).unwrap();
    let rows = state["diff"]["tensors"].as_array().unwrap();
    assert_eq!(rows.len(), diff.rows.len());
    for (page, cli) in rows.iter().zip(&diff.rows) {
        assert_eq!(page["name"], cli.name.as_str());
        assert_eq!(page["status"], cli.status(), "{}", cli.name);
        assert_eq!(
            page["explained"]["note"].as_str(),
            cli.explained().map(|e| e.note()).as_deref()
        );
    }
    assert_eq!(state["diff"]["first_divergence"], "4_post_mlp");
    let row = rows.iter().position(|r| r["name"] == "4_post_mlp").unwrap();
    // Its values, read now: the window around the planted difference, the element marked.
    let (status, body) = server.get(&format!("/api/values?row={row}&start=0,2,5,4&end=1,3,6,8"));
    assert_eq!(status, 200, "{body}");
    let v = json(&body);
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    let marked: Vec<&Json> = cells.iter().filter(|c| c[4] == true).collect();
    assert_eq!(marked.len(), 1);
    assert_eq!(marked[0][1], serde_json::json!([0, 2, 5, 7]));
    let (x, y) = (
        marked[0][2].as_f64().unwrap(),
        marked[0][3].as_f64().unwrap(),
    );
    assert!((y - x - 0.5).abs() < 1e-6, "{x} {y}");
    assert_eq!(v["b_shape"], serde_json::json!([12, 4, 4]));
    // Flat windows, scalars, a dict's tensor.
    let sliding = rows.iter().position(|r| r["name"] == "0_sliding").unwrap();
    let v = json(&server.get(&format!("/api/values?row={sliding}")).1);
    assert_eq!(v["shape"], serde_json::json!([]));
    assert_eq!(v["cells"], serde_json::json!([[0, [], 1.0, 1.0, false]]));
    let k = rows.iter().position(|r| r["name"] == "0_extras/k").unwrap();
    let v = json(
        &server
            .get(&format!("/api/values?row={k}&flat=true&start=2&end=100"))
            .1,
    );
    let got: Vec<f64> = v["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c[2].as_f64().unwrap())
        .collect();
    assert_eq!(got, [2.0, 3.0, 4.0, 5.0]);
    // Find: a range in B, then the next one after it.
    let (status, body) = server.get(&format!("/api/find?row={k}&side=b&lo=2.5&hi=10"));
    assert_eq!(
        (status, json(&body)["index"].clone()),
        (200, serde_json::json!([1, 0]))
    );
    let f = json(
        &server
            .get(&format!("/api/find?row={k}&side=a&lo=2.5&hi=10&after=3"))
            .1,
    );
    assert_eq!(f["flat"], 4);
    assert_eq!(
        json(&server.get(&format!("/api/find?row={k}&side=a&lo=99")).1)["flat"],
        Json::Null
    );
    // Out of range: clamped or refused, never a crash.
    assert_eq!(
        server
            .get(&format!("/api/values?row={row}&start=9,9,9,9,9"))
            .0,
        400
    );
    assert_eq!(
        server
            .get(&format!("/api/values?row={row}&start=0,99&end=1,100"))
            .0,
        200
    );
    assert_eq!(server.get("/api/values?row=100000").0, 404);
    let only = state["diff"]["tensors"].as_array().unwrap().len();
    assert!(only > 0);
    // Still serving; then Ctrl-C: it stops and leaves nothing behind.
    assert_eq!(server.get("/").0, 200);
    assert!(!empty(&tmp), "the uploads are kept while it runs");
    let status = server.interrupt();
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(empty(&tmp), "Ctrl-C left temporary files behind");
}

#[test]
fn two_large_archives_are_compared_in_bounded_memory() {
    // Two archives of 32 tensors of 4 MiB each (128 MiB a side; GOLDEN_VIEW_LARGE_MIB sets
    // another size, such as 2048 for the figure in docs/src/dump-viewer.md), made here with the tar crate; B
    // differs from A in one element of the last tensor.
    let mib: usize = std::env::var("GOLDEN_VIEW_LARGE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    let files = (mib / 4).max(2);
    const ELEMENTS: usize = 1 << 20;
    let d = Dir::new("view-large");
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let make = |path: &Path, changed: bool| {
        let mut t = tar::Builder::new(std::fs::File::create(path).unwrap());
        for k in 0..files {
            let values: Vec<u8> = (0..ELEMENTS)
                .flat_map(|i| {
                    let mut v = ((i * 7 + k) % 1000) as f32 * 0.001;
                    if changed && k == files - 1 && i == 12345 {
                        v += 1.0;
                    }
                    v.to_le_bytes()
                })
                .collect();
            let mut npy = Vec::new();
            let header =
                format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({ELEMENTS},), }}");
            let pad = 64 - (10 + header.len() + 1) % 64;
            npy.extend_from_slice(b"\x93NUMPY\x01\x00");
            npy.extend_from_slice(&((header.len() + pad + 1) as u16).to_le_bytes());
            npy.extend_from_slice(header.as_bytes());
            npy.extend(std::iter::repeat_n(b' ', pad));
            npy.push(b'\n');
            npy.extend_from_slice(&values);
            let mut h = tar::Header::new_gnu();
            h.set_size(npy.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            t.append_data(&mut h, format!("dump/{k}_post_mlp.npy"), &npy[..])
                .unwrap();
        }
        t.finish().unwrap();
    };
    let (ta, tb) = (d.path().join("a.tar"), d.path().join("b.tar"));
    make(&ta, false);
    make(&tb, true);
    let archive_bytes =
        std::fs::metadata(&ta).unwrap().len() + std::fs::metadata(&tb).unwrap().len();
    let server = Server::start(&[ta.to_str().unwrap(), tb.to_str().unwrap()], &tmp);
    let state = server.settled_state();
    assert_eq!(state["status"], "ready", "{state}");
    assert_eq!(
        state["diff"]["first_divergence"],
        format!("{}_post_mlp", files - 1)
    );
    let row = state["diff"]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .position(|r| r["status"] == "differ")
        .unwrap();
    let (status, body) = server.get(&format!(
        "/api/values?row={row}&flat=true&start=12340&end=12350"
    ));
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["cells"][5][4], true);
    let peak = std::fs::read_to_string(format!("/proc/{}/status", server.child.id()))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .map(|v| {
            v.trim()
                .trim_end_matches(" kB")
                .trim()
                .parse::<u64>()
                .unwrap()
                * 1024
        })
        .unwrap();
    println!(
        "golden view, two archives of {} MiB in all: peak resident memory {} MiB",
        archive_bytes >> 20,
        peak >> 20
    );
    // Each file is read when its pair is compared (two pairs at a time on two threads), then
    // dropped: the peak is a few tensors, not the archives.
    assert!(
        peak < archive_bytes / 2,
        "peak {peak} bytes for {archive_bytes} bytes of archives"
    );
    let status = server.interrupt();
    assert_eq!(status.code(), Some(130));
    assert!(empty(&tmp));
}

#[test]
fn a_failures_artifacts_folder_opens_as_its_reference_against_its_port() {
    let d = Dir::new("view-artifacts");
    let failure = d.path().join("failures/zoo/t_block");
    for (kind, shift) in [("trace/reference", 0.0), ("trace/port", 0.25)] {
        let dir = failure.join(kind);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, point) in ["embed", "blocks.0.attn", "blocks.0.mlp"]
            .iter()
            .enumerate()
        {
            let shift = if i == 2 { shift } else { 0.0 };
            let t = golden_files::HostTensor::from_f64(
                vec![2, 3],
                &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0 + shift],
            );
            golden_files::npy::write(&dir.join(format!("{i:03}_{point}.npy")), &t).unwrap();
        }
        std::fs::write(
            dir.join("order.txt"),
            "000_embed.npy\n001_blocks.0.attn.npy\n002_blocks.0.mlp.npy\n",
        )
        .unwrap();
    }
    std::fs::create_dir_all(failure.join("reference")).unwrap();
    std::fs::create_dir_all(failure.join("port")).unwrap();
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let server = Server::start(&[failure.to_str().unwrap()], &tmp);
    let state = server.settled_state();
    assert_eq!(state["status"], "ready", "{state}");
    assert!(state["sides"][0]["name"]
        .as_str()
        .unwrap()
        .ends_with("trace/reference"));
    assert!(state["sides"][1]["name"]
        .as_str()
        .unwrap()
        .ends_with("trace/port"));
    assert_eq!(state["diff"]["first_divergence"], "002_blocks.0.mlp");
    assert_eq!(state["diff"]["order"]["from"], "manifest");
    assert_eq!(server.interrupt().code(), Some(130));
}

/// Two folders of one `.npy` each, `x` (0, 1, …, 7 in A; B the same but element 5 is 50).
fn small_dumps(root: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (a, b) = (root.join("a"), root.join("b"));
    for (dir, changed) in [(&a, false), (&b, true)] {
        std::fs::create_dir_all(dir).unwrap();
        let mut values: Vec<f64> = (0..8).map(f64::from).collect();
        if changed {
            values[5] = 50.0;
        }
        let t = golden_files::HostTensor::from_f64(vec![8], &values);
        golden_files::npy::write(&dir.join("x.npy"), &t).unwrap();
    }
    (a, b)
}

#[test]
fn a_find_after_the_last_possible_index_wraps_around() {
    let d = Dir::new("view-find-after");
    let (a, b) = small_dumps(d.path());
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let server = Server::start(&[a.to_str().unwrap(), b.to_str().unwrap()], &tmp);
    assert_eq!(server.settled_state()["status"], "ready");
    // The largest index there is: the search goes on from the start, it does not overflow.
    let (status, body) = server.get(&format!(
        "/api/find?row=0&side=a&lo=2&hi=3&after={}",
        u64::MAX
    ));
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["flat"], 2, "{body}");
    let (status, body) = server.get(&format!(
        "/api/find?row=0&side=b&lo=50&after={}",
        u64::MAX - 1
    ));
    assert_eq!(
        (status, json(&body)["index"].clone()),
        (200, serde_json::json!([5])),
        "{body}"
    );
    assert_eq!(
        server.get("/api/find?row=0&side=a&lo=7&after=7").1,
        r#"{"flat":7,"index":[7]}"#
    );
    assert_eq!(server.interrupt().code(), Some(130));
}

#[test]
fn other_hosts_other_sites_and_requests_without_the_token_are_refused() {
    let d = Dir::new("view-refusals");
    let (a, b) = small_dumps(d.path());
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let server = Server::start(
        &[
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--max-upload",
            "1MiB",
        ],
        &tmp,
    );
    let port = server.port;
    // The printed address carries the launch's token: the page opens with it, and only with it.
    let token = server
        .token
        .clone()
        .unwrap_or_else(|| panic!("the printed address carries no token: {}", server.printed));
    assert!(token.len() >= 32, "{token}");
    assert_eq!(server.settled_state()["status"], "ready");
    let host = format!("Host: 127.0.0.1:{port}\r\n");
    let with_token = format!("X-Golden-Token: {token}\r\n");
    assert_eq!(server.get_with(&format!("/?token={token}"), &host).0, 200);
    assert_eq!(
        server
            .get_with(
                &format!("/?token={token}"),
                &format!("Host: localhost:{port}\r\n")
            )
            .0,
        200
    );
    let (status, page) = server.get_with("/", &host);
    assert_eq!(status, 403, "the page without the token: {page}");
    assert!(page.contains("golden view printed"), "{page}");
    for (what, headers) in [
        ("no token", host.clone()),
        (
            "a wrong token",
            format!("{host}X-Golden-Token: {}\r\n", "0".repeat(token.len())),
        ),
        ("the token in the query", host.clone()),
    ] {
        let path = if what == "the token in the query" {
            format!("/api/state?token={token}")
        } else {
            "/api/state".into()
        };
        let (status, body) = server.get_with(&path, &headers);
        assert_eq!(status, 403, "{what}: {body}");
        assert!(
            body.contains("token") && !body.contains("x.npy"),
            "{what}: {body}"
        );
    }
    // DNS rebinding: another name that resolves to 127.0.0.1 reaches the server with its own
    // Host, even with the token.
    for other in [
        format!("evil.test:{port}"),
        "evil.test".to_string(),
        format!("127.0.0.1.evil.test:{port}"),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
    ] {
        let (status, body) =
            server.get_with("/api/state", &format!("Host: {other}\r\n{with_token}"));
        assert_eq!(status, 403, "Host {other}: {body}");
        assert!(body.contains("Host") && !body.contains("x.npy"), "{body}");
        let (status, _) =
            server.get_with(&format!("/?token={token}"), &format!("Host: {other}\r\n"));
        assert_eq!(status, 403, "the page for Host {other}");
    }
    // Cross-site requests: refused by their Origin or Sec-Fetch-Site, even with the token, and
    // an upload is refused before a byte of it is written.
    let npy = std::fs::read(a.join("x.npy")).unwrap();
    for extra in [
        "Origin: http://evil.test\r\n".to_string(),
        format!("Origin: http://127.0.0.1:{}\r\n", port.wrapping_add(1)),
        "Origin: null\r\n".to_string(),
        "Sec-Fetch-Site: cross-site\r\n".to_string(),
        "Sec-Fetch-Site: same-site\r\n".to_string(),
    ] {
        let headers = format!("{host}{with_token}{extra}Content-Type: text/plain\r\n");
        let (status, body) = server.post_with("/api/upload?side=a&name=x.npy", &headers, &npy);
        assert_eq!(status, 403, "{extra}: {body}");
        let (status, body) = server.get_with("/api/state", &format!("{host}{with_token}{extra}"));
        assert_eq!(status, 403, "{extra}: {body}");
    }
    let state = server.settled_state();
    assert!(
        state["sides"][0]["name"].as_str().unwrap().ends_with("/a"),
        "a refused upload replaced A: {state}"
    );
    assert!(empty(&tmp), "a refused upload left files");
    // The page's own requests pass.
    let same = format!(
        "{host}{with_token}Origin: http://127.0.0.1:{port}\r\nSec-Fetch-Site: same-origin\r\n"
    );
    assert_eq!(server.get_with("/api/state", &same).0, 200);
    // Uploads: one at a time, and one larger than --max-upload is refused by its length, before
    // anything is written.
    let (status, body) = server.post_with(
        "/api/upload?side=b&name=big.npy",
        &format!("{host}{with_token}"),
        &vec![0u8; (1 << 20) + 1],
    );
    assert_eq!(status, 413, "{body}");
    assert!(empty(&tmp));
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    {
        use std::io::Write as _;
        slow.write_all(
            format!(
                "POST /api/upload?side=b&name=slow.npy HTTP/1.1\r\n{host}{with_token}Connection: close\r\nContent-Length: 1000\r\n\r\n0123"
            )
            .as_bytes(),
        )
        .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while empty(&tmp) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first upload never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (status, body) = server.post("/api/upload?side=a&name=x.npy", &npy);
    assert_eq!(status, 429, "a second upload while one is running: {body}");
    assert!(
        json(&body)["error"]
            .as_str()
            .unwrap()
            .contains("one at a time"),
        "{body}"
    );
    drop(slow);
    // Once the first is gone (broken off), the next one goes through.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (status, body) = server.post("/api/upload?side=a&name=x.npy", &npy);
        if status == 200 {
            break;
        }
        assert_eq!(status, 429, "{body}");
        assert!(
            std::time::Instant::now() < deadline,
            "the broken upload was never let go"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(server.interrupt().code(), Some(130));
    assert!(empty(&tmp));
}

/// A dump rewritten after the comparison read it: opening its pair read the new values and showed
/// them beside the old figures. Now the pair is refused with why, and the comparison runs again
/// (#31, minor items).
#[test]
fn a_dump_changed_since_the_comparison_is_compared_again_not_shown_beside_old_figures() {
    let d = Dir::new("view-changed");
    let (a, b) = small_dumps(d.path());
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let server = Server::start(&[a.to_str().unwrap(), b.to_str().unwrap()], &tmp);
    let state = server.settled_state();
    assert_eq!(state["diff"]["tensors"][0]["max_abs"], 45.0, "{state}");
    // B's x.npy now differs from A by 1000 at element 5.
    let mut values: Vec<f64> = (0..8).map(f64::from).collect();
    values[5] = 1005.0;
    let file = b.join("x.npy");
    golden_files::npy::write(&file, &golden_files::HostTensor::from_f64(vec![8], &values)).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let (status, body) = server.get("/api/values?row=0&flat=true&start=0&end=8");
    assert_eq!(status, 409, "new values beside the old figures: {body}");
    assert!(
        body.contains("changed since the comparison read it") && body.contains("x.npy"),
        "{body}"
    );
    // Compared again: the figures and the values agree.
    let state = server.settled_state();
    assert_eq!(state["diff"]["tensors"][0]["max_abs"], 1000.0, "{state}");
    let (status, body) = server.get("/api/values?row=0&flat=true&start=0&end=8");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["cells"][5][3], 1005.0, "{body}");
    assert_eq!(server.interrupt().code(), Some(130));
}
