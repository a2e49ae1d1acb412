//! `golden view` in a real browser: headless Chromium (Debian's `chromium`, as the HTML report's
//! test uses it) drives the page through its DevTools protocol on a pipe: it uploads two archives
//! of dumps that real PyTorch wrote into the drop zones, opens layer 3's `post_mlp` (B's two
//! tensor-parallel shards, squeezed and permuted), reads the values and the reshape note off the
//! page, moves the slice and reads again, jumps to the element outside the tolerance in layer 4,
//! and checks that a file named like markup is shown as text.

mod common;

use common::{archive, make_dumps, run_python, Dir, Server};
use serde_json::{json, Value as Json};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

fn chromium() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| {
            ["chromium", "chromium-browser", "google-chrome"].map(|name| dir.join(name))
        })
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the viewer's browser test needs a headless Chromium: install Debian's `chromium` \
                 (apt-get install chromium; `cargo xtask setup` does it when run as root)"
            )
        })
}

/// Chromium driven over `--remote-debugging-pipe`: requests on fd 3, answers and events on fd 4,
/// each a JSON message ended by a NUL byte.
struct Chrome {
    child: Child,
    to: std::io::PipeWriter,
    from: Receiver<Json>,
    next: u64,
    session: Option<String>,
}

impl Chrome {
    fn start(profile: &Path) -> Chrome {
        Chrome::start_with(profile, &[])
    }

    /// Chromium with more flags (`--host-resolver-rules=…`).
    fn start_with(profile: &Path, flags: &[&str]) -> Chrome {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let (their_in, to) = std::io::pipe().unwrap();
        let (mut from, their_out) = std::io::pipe().unwrap();
        let (r, w) = (their_in.as_raw_fd(), their_out.as_raw_fd());
        let mut cmd = Command::new(chromium());
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-pipe",
            "--window-size=1280,1800",
        ])
        .args([
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .args(flags)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        // SAFETY: between fork and exec only async-signal-safe calls (fcntl, dup2) on fds this
        // process owns: the pipe's ends become the child's fds 3 and 4.
        unsafe {
            cmd.pre_exec(move || {
                let (r2, w2) = (
                    libc::fcntl(r, libc::F_DUPFD, 10),
                    libc::fcntl(w, libc::F_DUPFD, 10),
                );
                if r2 < 0 || w2 < 0 || libc::dup2(r2, 3) < 0 || libc::dup2(w2, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("chromium starts");
        drop((their_in, their_out));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1 << 16];
            loop {
                let n = match from.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = buf.iter().position(|&b| b == 0) {
                    let message: Vec<u8> = buf.drain(..=end).collect();
                    if let Ok(v) = serde_json::from_slice(&message[..end]) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Chrome {
            child,
            to,
            from: rx,
            next: 1,
            session: None,
        }
    }

    /// Send a command (to the attached page, once attached) and wait for its answer.
    fn call(&mut self, method: &str, params: Json) -> Json {
        let id = self.next;
        self.next += 1;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(s) = &self.session {
            message["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to {method}"));
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    fn eval(&mut self, expression: &str) -> Json {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expression}: {r}");
        r["result"]["value"].clone()
    }

    /// Wait until `expression` is true (or a non-empty value), up to a minute.
    fn wait_for(&mut self, expression: &str) -> Json {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.eval(expression);
            if !(v.is_null() || v == false || v == "" || v == json!([])) {
                return v;
            }
            if Instant::now() >= deadline {
                let page = self.eval(
                    "JSON.stringify({status: document.body.dataset.status, line: document.getElementById('status').textContent, \
                     info: document.getElementById('detail-info').textContent, mode: document.getElementById('mode').value, \
                     window: [...document.querySelectorAll('#axes input')].map(i => i.id + '=' + i.value), \
                     rows: [...document.querySelectorAll('#values tr')].slice(0, 3).map(tr => tr.textContent), asked: window.__asked})",
                );
                panic!("waited in vain for {expression}; the page: {page}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Watch the page's requests for values (`window.__busy` counts those whose answer has not
    /// been read and drawn yet) and hold back any whose URL holds `window.__hold` until a later
    /// one is answered.
    fn watch_requests(&mut self) {
        self.eval(
            "(() => { const real = window.fetch; window.__busy = 0; window.__hold = null; window.__asked = []; \
             let release = null; \
             window.fetch = async (u, o) => { const url = String(u); \
               if (!/\\/api\\/(values|find)/.test(url)) return real(u, o); \
               window.__asked.push(url); window.__busy++; \
               const done = () => setTimeout(() => window.__busy--, 0); \
               let answer; \
               try { \
                 if (window.__hold && url.includes(window.__hold)) await new Promise(r => release = r); \
                 answer = await real(u, o); \
               } catch (e) { done(); throw e; } \
               if (release && !(window.__hold && url.includes(window.__hold))) setTimeout(release, 200); \
               const json = answer.json.bind(answer); \
               answer.json = async () => { try { return await json(); } finally { done(); } }; \
               return answer; }; })()",
        );
    }

    /// Click an element with the mouse, as a person does: once the page has drawn every answer
    /// it asked for (a table drawn under the pointer would move the element).
    fn click(&mut self, selector: &str) {
        self.wait_for("window.__busy === 0");
        self.click_now(selector);
    }

    /// Click at once, answers pending or not.
    fn click_now(&mut self, selector: &str) {
        let at = self.eval(&format!(
            "(() => {{ const e = document.querySelector({selector:?}); e.scrollIntoView({{block: 'center'}}); \
             const r = e.getBoundingClientRect(); const x = r.x + r.width / 2, y = r.y + r.height / 2; \
             return [x, y, e.contains(document.elementFromPoint(x, y))]; }})()"
        ));
        assert_eq!(
            at[2], true,
            "{selector} is not what a click at its centre hits"
        );
        let (x, y) = (at[0].as_f64().unwrap(), at[1].as_f64().unwrap());
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
    }

    /// Give a file input a file, as choosing it in the dialog does.
    fn choose_file(&mut self, selector: &str, file: &Path) {
        let root = self.call("DOM.getDocument", json!({}))["root"]["nodeId"].clone();
        let node = self.call(
            "DOM.querySelector",
            json!({"nodeId": root, "selector": selector}),
        )["nodeId"]
            .clone();
        self.call(
            "DOM.setFileInputFiles",
            json!({"nodeId": node, "files": [file]}),
        );
    }

    /// The values table's rows, each a list of its cells' texts.
    fn table(&mut self) -> Vec<Vec<String>> {
        let v = self.eval(
            "[...document.querySelectorAll('#values tr')].map(tr => [...tr.children].map(c => c.textContent))",
        );
        serde_json::from_value(v).unwrap()
    }
}

impl Chrome {
    /// A new tab, attached (its commands go to it from now on).
    fn tab(&mut self) {
        self.session = None;
        let target =
            self.call("Target.createTarget", json!({"url": "about:blank"}))["targetId"].clone();
        let session = self.call(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        )["sessionId"]
            .as_str()
            .unwrap()
            .to_string();
        self.session = Some(session);
        self.call("Page.enable", json!({}));
    }

    /// Evaluate an expression whose value is a promise: its result.
    fn eval_async(&mut self, expression: &str) -> Json {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expression}: {r}");
        r["result"]["value"].clone()
    }
}

impl Drop for Chrome {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn close(got: &str, want: f64) -> bool {
    got.parse::<f64>()
        .is_ok_and(|g| (g - want).abs() <= 1e-6 * want.abs().max(1.0))
}

#[test]
fn the_viewer_compares_two_uploaded_archives_in_headless_chromium() {
    let d = Dir::new("view-browser");
    let (a, b) = make_dumps(d.path());
    // A file whose name is markup: shown as its name, never as an element.
    let odd = "<img src=x onerror=alert(1)>";
    std::fs::copy(a.join("0_sliding.pth"), a.join(format!("{odd}.pth"))).unwrap();
    let (za, zb) = (
        d.path().join("model_a.zip"),
        d.path().join("model_b.tar.gz"),
    );
    archive(&a, &za);
    archive(&b, &zb);
    // What PyTorch says A's layer 3 post_mlp holds: the first 10 values, and [0, 2, 5, :].
    let expected: Json = serde_json::from_str(&run_python(
        r#"
import json, os, sys, torch
t = torch.load(os.path.join(sys.argv[1], "3_post_mlp.pth"))
print(json.dumps({"first": t.flatten()[:10].tolist(), "row": t[0, 2, 5, :].tolist(), "grid": t[0, 0, :10, :].tolist()}))
"#,
        &[&a],
    ))
    .unwrap();
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let server = Server::start(&[], &tmp);
    let mut chrome = Chrome::start(&d.path().join("profile"));
    let target =
        chrome.call("Target.createTarget", json!({"url": "about:blank"}))["targetId"].clone();
    let session = chrome.call(
        "Target.attachToTarget",
        json!({"targetId": target, "flatten": true}),
    )["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    chrome.session = Some(session);
    chrome.call("Page.enable", json!({}));
    chrome.call("Page.navigate", json!({"url": server.url()}));
    chrome.wait_for("document.body && document.body.dataset.status === 'waiting'");
    chrome.watch_requests();

    // The two archives, into the drop zones' file inputs.
    chrome.choose_file("#file-a", &za);
    chrome.wait_for("document.getElementById('name-a').textContent === 'model_a.zip'");
    chrome.choose_file("#file-b", &zb);
    chrome.wait_for(
        "document.body.dataset.status === 'ready' && !!document.querySelector('tr[data-name=\"3_post_mlp\"]')",
    );
    // The first divergence is highlighted; the names are text.
    let first = chrome.eval("[...document.querySelectorAll('tr.first')].map(t => t.dataset.name)");
    assert_eq!(first, json!(["4_post_mlp"]));
    assert_eq!(
        chrome.eval("document.querySelectorAll('img').length"),
        json!(0)
    );
    let odd_row = chrome.eval(&format!(
        "[...document.querySelectorAll('tr.row')].filter(t => t.children[1].textContent === {odd:?}).map(t => t.dataset.status)"
    ));
    assert_eq!(odd_row, json!(["only_in_a"]));

    // Layer 3's post_mlp: the note says how B was lined up, the values are A's and B's.
    chrome.click("tr[data-name=\"3_post_mlp\"]");
    chrome.wait_for("document.querySelectorAll('#values tr').length === 11");
    let note = chrome.eval("document.getElementById('detail-note').textContent");
    assert_eq!(
        note,
        "compared as torch.cat([3_post_mlp.rank0, 3_post_mlp.rank1], dim=2).permute(1, 0, 2).unsqueeze(0)"
    );
    let table = chrome.table();
    assert_eq!(table[0], ["index", "flat", "A", "B", "|A − B|"]);
    for (k, want) in expected["first"].as_array().unwrap().iter().enumerate() {
        let row = &table[k + 1];
        let want = want.as_f64().unwrap();
        assert_eq!(row[1], k.to_string());
        assert!(
            close(&row[2], want) && close(&row[3], want),
            "{row:?} against {want}"
        );
        assert_eq!(row[4], "0");
    }
    // Move the slice: the 1-D view of [0, 2, 5, :]. The answer for the window the mode change
    // asks for comes late (after the one for the window asked for next): it must not be drawn
    // over the newer one.
    // (A is [1, 4, 12, 8]: the mode change asks for [0, 0, 0, 0:8].)
    chrome.eval("window.__hold = 'end=1,1,1,8'");
    chrome.eval(
        "(() => { const m = document.getElementById('mode'); m.value = '1d'; m.dispatchEvent(new Event('change')); })()",
    );
    chrome.wait_for("!!document.getElementById('start-3')");
    chrome.eval(
        "(() => { const set = (id, v) => document.getElementById(id).value = v; \
         set('start-1', 2); set('end-1', 3); set('start-2', 5); set('end-2', 6); set('start-3', 0); set('end-3', 8); })()",
    );
    chrome.click_now("#show");
    chrome.wait_for(
        "[...document.querySelectorAll('#values tr')].some(tr => tr.children[0].textContent === '[0, 2, 5, 7]')",
    );
    chrome.wait_for("window.__busy === 0");
    chrome.eval("window.__hold = null");
    let table = chrome.table();
    assert_eq!(table.len(), 9, "{table:?}");
    for (k, want) in expected["row"].as_array().unwrap().iter().enumerate() {
        let row = &table[k + 1];
        let want = want.as_f64().unwrap();
        assert_eq!(row[0], format!("[0, 2, 5, {k}]"));
        assert!(
            close(&row[2], want) && close(&row[3], want),
            "{row:?} against {want}"
        );
    }

    // The 2-D view: A[0, 0, :10, :] as a grid, each cell A over B.
    chrome.eval(
        "(() => { const m = document.getElementById('mode'); m.value = '2d'; m.dispatchEvent(new Event('change')); })()",
    );
    let grid = chrome.wait_for(
        "document.querySelectorAll('#values tr').length === 11 && [...document.querySelectorAll('#values tr')].slice(1).map(tr => [...tr.querySelectorAll('td')].map(td => [td.querySelector('.a').textContent, td.querySelector('.b').textContent]))",
    );
    let grid: Vec<Vec<(String, String)>> = serde_json::from_value(grid).unwrap();
    for (i, row) in expected["grid"].as_array().unwrap().iter().enumerate() {
        let row = row.as_array().unwrap();
        assert_eq!(grid[i].len(), 8);
        for (j, want) in row.iter().enumerate() {
            let (x, y) = &grid[i][j];
            let want = want.as_f64().unwrap();
            assert!(
                close(x, want) && close(y, want),
                "[{i}, {j}]: {x} {y} against {want}"
            );
        }
    }

    // Layer 4: jump to the worst element, marked outside the tolerance.
    chrome.click("tr[data-name=\"4_post_mlp\"]");
    chrome.wait_for("document.getElementById('detail-name').textContent === '4_post_mlp'");
    chrome.click("#worst");
    let marked = chrome.wait_for(
        "[...document.querySelectorAll('#values td.out.at')].map(td => td.parentElement.children[0].textContent)",
    );
    assert_eq!(marked[0], "[0, 2, 5, 7]");
    // Find a value as typed: B's changed element.
    let b_value = chrome.eval(
        "[...document.querySelectorAll('#values tr')].find(tr => tr.children[0].textContent === '[0, 2, 5, 7]').children[3].textContent",
    );
    chrome.eval(&format!(
        "(() => {{ document.getElementById('find').value = {:?}; document.getElementById('find-side').value = 'b'; }})()",
        b_value.as_str().unwrap()
    ));
    chrome.click("#find-next");
    let found = chrome.wait_for("document.getElementById('find-result').textContent");
    assert!(
        found.as_str().unwrap().starts_with("found at [0, 2, 5, 7]"),
        "{found}"
    );

    drop(chrome);
    assert_eq!(server.interrupt().code(), Some(130));
    assert!(std::fs::read_dir(&tmp).unwrap().next().is_none());
}

/// A second web server, of another site: every request gets `page`. It stops when dropped.
struct OtherSite {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtherSite {
    fn start(page: String) -> OtherSite {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut request = Vec::new();
                let mut chunk = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = s.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                        page.len()
                    )
                    .as_bytes(),
                );
            }
        });
        OtherSite {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for OtherSite {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_page_of_another_site_can_neither_read_the_viewer_nor_replace_a_side() {
    let d = Dir::new("view-browser-other-site");
    // Two dumps of one tensor, given on the command line; the attack's file is a valid .npy of
    // the same name whose values match B's: an upload that got through would show a match.
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    for (dir, x) in [(&a, 1.0), (&b, 2.0)] {
        std::fs::create_dir_all(dir).unwrap();
        let t = golden_files::HostTensor::from_f64(vec![4], &[x, x, x, x]);
        golden_files::npy::write(&dir.join("x.npy"), &t).unwrap();
    }
    let evil: Vec<u8> = std::fs::read(b.join("x.npy")).unwrap();
    let tmp = d.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let server = Server::start(&[a.to_str().unwrap(), b.to_str().unwrap()], &tmp);
    assert_eq!(server.settled_state()["status"], "ready");
    let vp = server.port;
    let bytes = evil
        .iter()
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join(",");
    // The other site's page: it tries every way a page can reach another origin without asking
    // it first (no preflight): fetch and XHR of the state, a no-cors POST upload with a text/plain
    // body, a form POST; each outcome is written into `window.results`.
    let page = format!(
        r#"<!doctype html><html><body><script>
window.results = {{}};
const V = "http://127.0.0.1:{vp}";
const evil = new Uint8Array([{bytes}]);
async function attempt(name, f) {{
  try {{ window.results[name] = "got: " + String(await f()); }}
  catch (e) {{ window.results[name] = "failed: " + e; }}
}}
(async () => {{
  await attempt("fetch state", async () => (await fetch(V + "/api/state")).text());
  await attempt("fetch state from localhost", async () => (await fetch("http://localhost:{vp}/api/state")).text());
  await attempt("fetch state with a guessed token", async () => (await fetch(V + "/api/state", {{headers: {{"X-Golden-Token": "guess"}}}})).text());
  await attempt("xhr state", () => new Promise((ok, bad) => {{
    const x = new XMLHttpRequest(); x.open("GET", V + "/api/state");
    x.onload = () => ok(x.responseText); x.onerror = () => bad("xhr error"); x.send(); }}));
  await attempt("no-cors upload", async () => (await fetch(V + "/api/upload?side=a&name=x.npy",
    {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}}, body: evil}})).type);
  await attempt("form upload", () => new Promise((ok) => {{
    const sink = document.createElement("iframe"); sink.name = "sink"; document.body.append(sink);
    const form = document.createElement("form"); form.method = "POST"; form.enctype = "text/plain";
    form.target = "sink"; form.action = V + "/api/upload?side=b&name=x.npy";
    const input = document.createElement("input"); input.name = "x"; input.value = "y"; form.append(input);
    document.body.append(form); sink.onload = () => ok("submitted"); form.submit(); }}));
  window.done = true;
}})();
</script></body></html>"#
    );
    let other = OtherSite::start(page);
    let mut chrome = Chrome::start_with(
        &d.path().join("profile"),
        &["--host-resolver-rules=MAP attacker.test 127.0.0.1, MAP rebound.test 127.0.0.1"],
    );
    chrome.tab();
    chrome.call(
        "Page.navigate",
        json!({"url": format!("http://attacker.test:{}/", other.port)}),
    );
    chrome.wait_for("window.done === true");
    let results = chrome.eval("window.results");
    println!("the other site's attempts: {results:#}");
    for (what, outcome) in results.as_object().unwrap() {
        let outcome = outcome.as_str().unwrap();
        assert!(
            !outcome.contains("x.npy") && !outcome.contains("tensors"),
            "{what}: the other site read the viewer: {outcome}"
        );
    }

    // DNS rebinding: a name of the attacker's that now resolves to 127.0.0.1, at the viewer's
    // port. Its page is the attacker's origin; its script asks for the state and uploads, as the
    // page itself does — even with the token, were it guessed.
    chrome.tab();
    chrome.call(
        "Page.navigate",
        json!({"url": format!("http://rebound.test:{vp}/")}),
    );
    chrome
        .wait_for("document.readyState === 'complete' && location.host.startsWith('rebound.test')");
    let token = server.token.clone().unwrap_or_default();
    let read = chrome.eval_async(&format!(
        "fetch('/api/state', {{headers: {{'X-Golden-Token': {token:?}}}}}).then(r => r.status + ' ' + r.statusText).catch(e => 'failed: ' + e)"
    ));
    println!("rebound read: {read}");
    assert!(
        read.as_str().unwrap().starts_with("403"),
        "a rebound name read the state: {read}"
    );
    let upload = chrome.eval_async(&format!(
        "fetch('/api/upload?side=a&name=x.npy', {{method: 'POST', headers: {{'X-Golden-Token': {token:?}}}, body: new Uint8Array([{bytes}])}}).then(r => String(r.status)).catch(e => 'failed: ' + e)"
    ));
    assert_eq!(upload, "403", "a rebound name uploaded");

    // Nothing reached the viewer: its sides are what the command line gave, and no upload was
    // written.
    drop(chrome);
    let state = server.settled_state();
    for (k, dir) in [(0, &a), (1, &b)] {
        assert_eq!(
            state["sides"][k]["name"].as_str(),
            Some(dir.to_str().unwrap()),
            "a side was replaced: {state}"
        );
    }
    assert_eq!(state["diff"]["match"], false, "{state}");
    assert!(std::fs::read_dir(&tmp).unwrap().next().is_none());
    assert_eq!(server.interrupt().code(), Some(130));
}
