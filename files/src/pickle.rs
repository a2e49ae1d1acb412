//! PyTorch's `.pt`/`.pth` files (`torch.save`), read without running any pickled code.
//!
//! A file is a zip archive: `<name>/data.pkl` (a pickle of the saved object, tensors standing in as
//! references to storages) and `<name>/data/<key>` (each storage's raw bytes). Unpickling normally
//! calls whatever functions the pickle names; this reader instead interprets the opcodes itself
//! and understands only data — dicts, lists, tuples, numbers, strings — and the few torch
//! functions that rebuild a tensor from a storage. Anything else becomes an opaque value that is
//! never called, so a hostile file can fail to read, but not run code.
//!
//! Opening a file unpickles `data.pkl` and names its tensors, dtypes and shapes; a tensor's data is
//! read when it is loaded. Each storage (`data/<key>`) is read once and shared: a view that is a
//! contiguous run of its storage is a slice of it, and only a view that is not (a transpose, an
//! `expand`) is copied.
//!
//! Bounds, all charged to the file's [`Budget`]: the pickle's objects (values are shared rather
//! than copied: memo and containers hold `Rc`s), the names, inflated entries and copied views.
//! Walking the result visits at most [`MAX_NODES`] values, and a view may not read outside its
//! storage.

use crate::archive::Archive;
use crate::budget::{Budget, OverBudget, ReadError};
use crate::tensor::{Entry, HostTensor, Narrow, Skipped, Strided, WireDType};
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Most values the walk over the unpickled object visits.
pub const MAX_NODES: usize = 1 << 20;

type Shared<T> = Rc<RefCell<T>>;

/// A storage referenced by the pickle (`BINPERSID`).
#[derive(Clone, Debug)]
struct Storage {
    dtype: StorageType,
    key: String,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum StorageType {
    Wire(WireDType),
    /// int8: read and widened to i16 (the wire format has no int8).
    Narrow(Narrow),
}

impl StorageType {
    fn size(self) -> usize {
        match self {
            StorageType::Wire(d) => d.size(),
            StorageType::Narrow(n) => n.size(),
        }
    }

    /// The dtype golden reads the elements as.
    fn wire(self) -> WireDType {
        match self {
            StorageType::Wire(d) => d,
            StorageType::Narrow(n) => n.wide(),
        }
    }
}

/// A tensor: a view of a storage.
#[derive(Clone, Debug)]
struct TensorRef {
    storage: Storage,
    offset: usize,
    shape: Vec<usize>,
    stride: Vec<usize>,
}

#[derive(Clone, Debug)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    Bytes,
    List(Shared<Vec<Value>>),
    Tuple(Rc<[Value]>),
    Dict(Shared<Vec<(Value, Value)>>),
    Global(Rc<str>, Rc<str>),
    Storage(Storage),
    Tensor(Rc<TensorRef>),
    /// Something this reader does not interpret (and never calls), described: what an unknown
    /// function would return, an object of an unknown class.
    Opaque(Rc<str>),
    Mark,
}

fn err<T>(msg: impl Into<String>) -> Result<T, String> {
    Err(msg.into())
}

fn storage_type(class: &str) -> Result<StorageType, String> {
    Ok(StorageType::Wire(match class {
        "FloatStorage" => WireDType::F32,
        "DoubleStorage" => WireDType::F64,
        "HalfStorage" => WireDType::F16,
        "BFloat16Storage" => WireDType::BF16,
        "LongStorage" => WireDType::I64,
        "IntStorage" => WireDType::I32,
        "ShortStorage" => WireDType::I16,
        "ByteStorage" => WireDType::U8,
        "BoolStorage" => WireDType::Bool,
        "CharStorage" => return Ok(StorageType::Narrow(Narrow::I8)),
        other => return err(format!("storages of type {other} are not supported")),
    }))
}

/// Bytes charged for each opcode run: a value and its place on the stack or in a container.
const OPCODE_COST: u64 = 64;

/// Every list and dict the pickle made. A pickle can put a list inside itself (APPEND it to
/// itself through the memo), a cycle of `Rc`s that would never be freed: dropping this empties
/// them all, which breaks every cycle.
#[derive(Default)]
struct Containers {
    lists: Vec<Shared<Vec<Value>>>,
    dicts: Vec<Shared<Vec<(Value, Value)>>>,
}

impl Containers {
    fn list(&mut self, items: Vec<Value>) -> Value {
        let l = Rc::new(RefCell::new(items));
        self.lists.push(l.clone());
        Value::List(l)
    }

    fn dict(&mut self, pairs: Vec<(Value, Value)>) -> Value {
        let d = Rc::new(RefCell::new(pairs));
        self.dicts.push(d.clone());
        Value::Dict(d)
    }

    /// Keep a container made elsewhere (an `OrderedDict()`).
    fn keep(&mut self, v: &Value) {
        match v {
            Value::List(l) => self.lists.push(l.clone()),
            Value::Dict(d) => self.dicts.push(d.clone()),
            _ => {}
        }
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        // Taken out first: emptying one may drop the last handle of another.
        for l in &self.lists {
            let items = std::mem::take(&mut *l.borrow_mut());
            drop(items);
        }
        for d in &self.dicts {
            let pairs = std::mem::take(&mut *d.borrow_mut());
            drop(pairs);
        }
    }
}

struct Machine<'a, 'b> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    memo: HashMap<u32, Value>,
    /// Bytes of objects made and not yet charged.
    cost: u64,
    budget: &'b mut Budget,
    /// The refusal of a charge, when that is why the run stopped.
    over: Option<OverBudget>,
    containers: Containers,
}

impl<'a> Machine<'a, '_> {
    /// Charge what the objects made so far cost.
    fn settle(&mut self) -> Result<(), String> {
        let cost = std::mem::take(&mut self.cost);
        self.budget
            .charge("the pickle's objects", cost)
            .map_err(|over| {
                let message = over.to_string();
                self.over = Some(over);
                message
            })
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.data.len());
        let Some(end) = end else {
            return err("the pickle ends early");
        };
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn line(&mut self) -> Result<&'a str, String> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|b| *b == b'\n')
            .ok_or("a pickle text line without its end")?;
        let line = std::str::from_utf8(&rest[..n]).map_err(|_| "a pickle line is not text")?;
        self.pos += n + 1;
        Ok(line)
    }
    fn text(&mut self, n: usize) -> Result<Value, String> {
        let bytes = self.take(n)?;
        self.cost += n as u64;
        let s = std::str::from_utf8(bytes).map_err(|_| "a pickled string is not UTF-8")?;
        Ok(Value::Str(s.into()))
    }
    fn pop(&mut self) -> Result<Value, String> {
        self.stack
            .pop()
            .ok_or_else(|| "the pickle pops an empty stack".into())
    }
    /// Everything above the topmost mark, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<Value>, String> {
        let at = self
            .stack
            .iter()
            .rposition(|v| matches!(v, Value::Mark))
            .ok_or("the pickle has no mark to pop to")?;
        let items = self.stack.split_off(at + 1);
        self.stack.pop();
        Ok(items)
    }
    fn top(&mut self) -> Result<&mut Value, String> {
        self.stack
            .last_mut()
            .ok_or_else(|| "the pickle uses an empty stack".into())
    }

    fn run(&mut self) -> Result<Value, String> {
        let mut ops = 0u32;
        loop {
            let op = self.u8()?;
            self.cost += OPCODE_COST;
            ops = ops.wrapping_add(1);
            if ops.is_multiple_of(4096) {
                self.settle()?;
            }
            match op {
                0x80 => {
                    self.u8()?; // PROTO
                }
                0x95 => {
                    self.take(8)?; // FRAME
                }
                b'.' => {
                    self.settle()?;
                    return self.pop();
                }
                b'(' => self.stack.push(Value::Mark),
                b'}' => {
                    let d = self.containers.dict(Vec::new());
                    self.stack.push(d);
                }
                b']' => {
                    let l = self.containers.list(Vec::new());
                    self.stack.push(l);
                }
                b')' => self.stack.push(Value::Tuple(Rc::from(Vec::new()))),
                b't' => {
                    let items = self.pop_mark()?;
                    self.stack.push(Value::Tuple(items.into()));
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        return err("a tuple of more items than the stack holds");
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.stack.push(Value::Tuple(items.into()));
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    let l = self.containers.list(items);
                    self.stack.push(l);
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let pairs = pairs(items)?;
                    let d = self.containers.dict(pairs);
                    self.stack.push(d);
                }
                b'a' => {
                    let item = self.pop()?;
                    append(self.top()?, vec![item])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    append(self.top()?, items)?;
                }
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    set_items(self.top()?, vec![(key, value)])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let pairs = pairs(items)?;
                    set_items(self.top()?, pairs)?;
                }
                b'q' => {
                    let k = self.u8()? as u32;
                    self.put(k)?;
                }
                b'r' => {
                    let k = self.u32()?;
                    self.put(k)?;
                }
                b'p' => {
                    let k = self.line()?.parse().map_err(|_| "a PUT without a number")?;
                    self.put(k)?;
                }
                0x94 => {
                    let k = self.memo.len() as u32;
                    self.put(k)?;
                }
                b'h' => {
                    let k = self.u8()? as u32;
                    self.get(k)?;
                }
                b'j' => {
                    let k = self.u32()?;
                    self.get(k)?;
                }
                b'g' => {
                    let k = self.line()?.parse().map_err(|_| "a GET without a number")?;
                    self.get(k)?;
                }
                b'J' => {
                    let v = i32::from_le_bytes(self.take(4)?.try_into().unwrap());
                    self.stack.push(Value::Int(v.into()));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.stack.push(Value::Int(v.into()));
                }
                b'M' => {
                    let v = self.u16()?;
                    self.stack.push(Value::Int(v.into()));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        self.u8()? as usize
                    } else {
                        self.u32()? as usize
                    };
                    let bytes = self.take(n)?;
                    if n > 8 {
                        return err("an integer wider than 64 bits");
                    }
                    let mut buf = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
                        [0xff; 8]
                    } else {
                        [0; 8]
                    };
                    buf[..n].copy_from_slice(bytes);
                    self.stack.push(Value::Int(i64::from_le_bytes(buf)));
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.take(8)?.try_into().unwrap());
                    self.stack.push(Value::Float(v));
                }
                b'N' => self.stack.push(Value::None),
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                b'X' => {
                    let n = self.u32()? as usize;
                    let v = self.text(n)?;
                    self.stack.push(v);
                }
                0x8c => {
                    let n = self.u8()? as usize;
                    let v = self.text(n)?;
                    self.stack.push(v);
                }
                0x8d => {
                    let n = u64::from_le_bytes(self.take(8)?.try_into().unwrap());
                    let n = usize::try_from(n).map_err(|_| "a string longer than memory")?;
                    let v = self.text(n)?;
                    self.stack.push(v);
                }
                b'T' | b'B' => {
                    let n = self.u32()? as usize;
                    self.take(n)?;
                    self.stack.push(Value::Bytes);
                }
                b'U' | b'C' => {
                    let n = self.u8()? as usize;
                    self.take(n)?;
                    self.stack.push(Value::Bytes);
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.stack.push(Value::Global(module.into(), name.into()));
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Value::Str(m), Value::Str(n)) => self.stack.push(Value::Global(m, n)),
                        _ => return err("STACK_GLOBAL without two strings"),
                    }
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = reduce(callable, args)?;
                    self.containers.keep(&v);
                    self.stack.push(v);
                }
                0x81 => {
                    let _args = self.pop()?;
                    let class = self.pop()?;
                    let what = format!("a `{}` object, never built", describe(&class));
                    self.stack.push(Value::Opaque(what.into()));
                }
                b'b' => {
                    // BUILD sets an object's state: nothing this reader keeps has any.
                    self.pop()?;
                    self.top()?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let v = persistent_load(pid)?;
                    self.stack.push(v);
                }
                other => {
                    return err(format!(
                        "pickle opcode 0x{other:02x} is not one golden reads (it reads tensors, \
                         dicts, lists, tuples, numbers and strings, and never runs pickled code)"
                    ))
                }
            }
        }
    }

    fn put(&mut self, k: u32) -> Result<(), String> {
        let v = self.top()?.clone();
        self.memo.insert(k, v);
        Ok(())
    }

    fn get(&mut self, k: u32) -> Result<(), String> {
        let v =
            self.memo.get(&k).cloned().ok_or_else(|| {
                format!("the pickle refers to memo entry {k}, which it never set")
            })?;
        self.stack.push(v);
        Ok(())
    }
}

fn pairs(items: Vec<Value>) -> Result<Vec<(Value, Value)>, String> {
    if !items.len().is_multiple_of(2) {
        return err("a dict of an odd number of items");
    }
    let mut it = items.into_iter();
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Ok(out)
}

fn append(target: &mut Value, items: Vec<Value>) -> Result<(), String> {
    match target {
        Value::List(l) => {
            l.borrow_mut().extend(items);
            Ok(())
        }
        Value::Opaque(_) => Ok(()),
        _ => err("APPEND to something that is not a list"),
    }
}

fn set_items(target: &mut Value, items: Vec<(Value, Value)>) -> Result<(), String> {
    match target {
        Value::Dict(d) => {
            d.borrow_mut().extend(items);
            Ok(())
        }
        Value::Opaque(_) => Ok(()),
        _ => err("SETITEM on something that is not a dict"),
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Global(m, n) => format!("{m}.{n}"),
        // Not its Debug form: a hostile pickle can make that exponentially long.
        other => kind(other).0,
    }
}

fn int(v: &Value) -> Result<i64, String> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::Bool(b) => Ok(*b as i64),
        _ => err("expected an integer"),
    }
}

fn sizes(v: &Value) -> Result<Vec<usize>, String> {
    let items: Vec<Value> = match v {
        Value::Tuple(t) => t.to_vec(),
        Value::List(l) => l.borrow().clone(),
        _ => return err("a tensor's size or stride is not a tuple"),
    };
    if items.len() > crate::tensor::MAX_NDIM {
        return err(format!("a tensor of {} axes", items.len()));
    }
    items
        .iter()
        .map(|v| usize::try_from(int(v)?).map_err(|_| "a negative size or stride".to_string()))
        .collect()
}

fn tuple_items(v: &Value) -> Result<Vec<Value>, String> {
    match v {
        Value::Tuple(t) => Ok(t.to_vec()),
        _ => err("expected a tuple of arguments"),
    }
}

fn reduce(callable: Value, args: Value) -> Result<Value, String> {
    let Value::Global(module, name) = &callable else {
        let what = format!("what calling {} returns, never called", kind(&callable).0);
        return Ok(Value::Opaque(what.into()));
    };
    match (&**module, &**name) {
        ("torch._utils", "_rebuild_tensor" | "_rebuild_tensor_v2") => {
            let a = tuple_items(&args)?;
            let [storage, offset, size, stride, ..] = &a[..] else {
                return err("_rebuild_tensor with too few arguments");
            };
            let Value::Storage(storage) = storage else {
                return err("_rebuild_tensor of something that is not a storage");
            };
            Ok(Value::Tensor(Rc::new(TensorRef {
                storage: storage.clone(),
                offset: usize::try_from(int(offset)?).map_err(|_| "a negative storage offset")?,
                shape: sizes(size)?,
                stride: sizes(stride)?,
            })))
        }
        ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => {
            let a = tuple_items(&args)?;
            Ok(a.into_iter().next().unwrap_or(Value::None))
        }
        ("torch._tensor", "_rebuild_from_type_v2") => {
            // (function, type, args, state): the function rebuilds the tensor from args.
            let a = tuple_items(&args)?;
            match (a.first(), a.get(2)) {
                (Some(f), Some(inner)) => reduce(f.clone(), inner.clone()),
                _ => err("_rebuild_from_type_v2 with too few arguments"),
            }
        }
        ("collections", "OrderedDict") => Ok(Value::Dict(Rc::new(RefCell::new(Vec::new())))),
        ("torch", "Size") => Ok(tuple_items(&args)?
            .into_iter()
            .next()
            .unwrap_or(Value::Tuple(Rc::from(Vec::new())))),
        _ => Ok(Value::Opaque(
            format!("what `{module}.{name}(...)` returns, never called").into(),
        )),
    }
}

fn persistent_load(pid: Value) -> Result<Value, String> {
    let items = tuple_items(&pid)?;
    match &items[..] {
        [Value::Str(kind), Value::Global(_, class), Value::Str(key), ..]
            if &**kind == "storage" =>
        {
            Ok(Value::Storage(Storage {
                dtype: storage_type(class)?,
                key: key.to_string(),
            }))
        }
        _ => err("a persistent id that is not a torch storage"),
    }
}

/// The named tensors of an unpickled object: a tensor, a number, or dicts/lists/tuples of them
/// (nested names joined with `.`). Other values are counted in `skipped`.
/// What a value is, for the names of what is skipped: singular and plural.
fn kind(v: &Value) -> (String, String) {
    let two = |s: &str, p: &str| (s.to_string(), p.to_string());
    match v {
        Value::None => two("None", "None"),
        Value::Bool(_) => two("a bool", "bools"),
        Value::Int(_) => two("an int", "ints"),
        Value::Float(_) => two("a float", "floats"),
        Value::Str(_) => two("a string", "strings"),
        Value::Bytes => two("bytes", "bytes"),
        Value::List(_) => two("a list", "lists"),
        Value::Tuple(_) => two("a tuple", "tuples"),
        Value::Dict(_) => two("a dict", "dicts"),
        Value::Global(m, n) => (
            format!("a reference to `{m}.{n}`"),
            "references to classes or functions".into(),
        ),
        Value::Storage(_) => two("a storage without a tensor", "storages"),
        Value::Tensor(_) => two("a tensor", "tensors"),
        Value::Opaque(what) => (what.to_string(), "objects golden does not build".into()),
        Value::Mark => two("a pickle mark", "pickle marks"),
    }
}

/// A container that holds no tensor or number: what it holds, in a few words
/// (`a dict of 3 strings`, `an empty list`, `a list of 2 values: strings and None`).
fn summary(v: &Value) -> String {
    let (what, items): (&str, Vec<Value>) = match v {
        Value::Dict(d) => ("dict", d.borrow().iter().map(|(_, v)| v.clone()).collect()),
        Value::List(l) => ("list", l.borrow().clone()),
        Value::Tuple(t) => ("tuple", t.to_vec()),
        other => return kind(other).0,
    };
    let article = |w: &str| {
        if w.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        }
    };
    if items.is_empty() {
        return format!("an empty {what}");
    }
    let mut kinds: Vec<String> = Vec::new();
    for item in &items {
        let plural = kind(item).1;
        if !kinds.contains(&plural) {
            kinds.push(plural);
        }
    }
    let n = items.len();
    if kinds.len() == 1 {
        let (one, many) = kind(&items[0]);
        let noun = if n == 1 {
            one.trim_start_matches("a ")
                .trim_start_matches("an ")
                .to_string()
        } else {
            many
        };
        format!("{} {what} of {n} {noun}", article(what))
    } else {
        format!(
            "{} {what} of {n} values: {}",
            article(what),
            join_and(&kinds)
        )
    }
}

fn join_and(words: &[String]) -> String {
    match words {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// Walks the unpickled object for its tensors and numbers.
struct Walk<'b> {
    found: Vec<(String, Value)>,
    skipped: Vec<Skipped>,
    nodes: usize,
    budget: &'b mut Budget,
}

impl Walk<'_> {
    /// Names cost memory too: each is charged, with its place in a list (a hostile pickle can
    /// nest long keys).
    fn charge(&mut self, name: &str) -> Result<(), ReadError> {
        self.budget
            .charge("the names of the saved object", name.len() as u64 + 128)?;
        Ok(())
    }

    fn skip(&mut self, name: &str, what: String) -> Result<(), ReadError> {
        self.charge(name)?;
        self.charge(&what)?;
        self.skipped.push(Skipped {
            name: name.to_string(),
            what,
        });
        Ok(())
    }

    /// The named tensors and numbers under `value`, nested names joined with `.`; what is neither
    /// is named in `skipped` (a container of nothing but such values as one entry).
    fn collect(&mut self, value: &Value, name: &str, depth: usize) -> Result<(), ReadError> {
        if self.nodes >= MAX_NODES || depth > 64 {
            return Err(ReadError::Unreadable(
                "the saved object is too deeply nested or too large to walk".into(),
            ));
        }
        self.nodes += 1;
        // The name of every value walked is a string of its own while the walk is below it.
        self.charge(name)?;
        // Exactly as long as it needs (`format!` may take twice that), as charged.
        let join = |key: &str| {
            if name.is_empty() {
                return key.to_string();
            }
            let mut joined = String::with_capacity(name.len() + 1 + key.len());
            joined.push_str(name);
            joined.push('.');
            joined.push_str(key);
            joined
        };
        let (found, skipped) = (self.found.len(), self.skipped.len());
        match value {
            Value::Tensor(_) | Value::Int(_) | Value::Float(_) | Value::Bool(_) => {
                self.charge(name)?;
                self.found.push((name.to_string(), value.clone()));
                return Ok(());
            }
            Value::Dict(d) => {
                for (k, v) in d.borrow().iter() {
                    match k {
                        Value::Str(s) => self.collect(v, &join(s), depth + 1)?,
                        Value::Int(i) => self.collect(v, &join(&i.to_string()), depth + 1)?,
                        other => {
                            let what =
                                format!("{}, under a key that is {}", kind(v).0, kind(other).0);
                            self.skip(&format!("{name}[?]"), what)?;
                        }
                    }
                }
            }
            Value::List(l) => {
                for (i, v) in l.borrow().iter().enumerate() {
                    self.collect(v, &join(&i.to_string()), depth + 1)?;
                }
            }
            Value::Tuple(t) => {
                for (i, v) in t.iter().enumerate() {
                    self.collect(v, &join(&i.to_string()), depth + 1)?;
                }
            }
            other => return self.skip(name, kind(other).0),
        }
        // A container of nothing golden reads is named once, with what it holds.
        if self.found.len() == found {
            self.skipped.truncate(skipped);
            self.skip(name, summary(value))?;
        }
        Ok(())
    }
}

fn scalar(v: &Value) -> HostTensor {
    match v {
        Value::Float(f) => HostTensor::from_f64(Vec::new(), &[*f]),
        Value::Bool(b) => HostTensor {
            dtype: WireDType::Bool,
            shape: Vec::new(),
            data: vec![*b as u8].into(),
        },
        Value::Int(i) => HostTensor {
            dtype: WireDType::I64,
            shape: Vec::new(),
            data: i.to_le_bytes().to_vec().into(),
        },
        _ => unreachable!("only numbers are scalars"),
    }
}

/// One tensor or number of the saved object, not yet read.
enum Item {
    View(Rc<TensorRef>),
    Number(HostTensor),
}

/// An opened `.pt` file: its tensors' names, dtypes and shapes from the pickle, the data read
/// only when a tensor is loaded. Each storage is read once and shared by its views.
pub(crate) struct Pickled {
    /// The tensors and numbers, in the saved object's order.
    pub entries: Vec<Entry>,
    /// What is neither, by name.
    pub skipped: Vec<Skipped>,
    items: Vec<Item>,
    /// The archive's folder (`archive/`).
    prefix: String,
    storages: HashMap<String, Bytes>,
}

/// Unpickle a `.pt` file's `data.pkl` (its objects charged to `budget`); `stem` names a file
/// that holds a single tensor or number.
pub(crate) fn open(
    archive: &mut Archive,
    budget: &mut Budget,
    stem: &str,
) -> Result<Pickled, ReadError> {
    let zip = &mut archive.zip;
    let pickle_index = (0..zip.len())
        .find(|i| {
            zip.name_for_index(*i)
                .and_then(|n| n.ok())
                .is_some_and(|n| n.ends_with("data.pkl"))
        })
        .ok_or_else(|| {
            ReadError::Unreadable("no data.pkl in the archive: not a torch.save file".into())
        })?;
    let pickle_name = zip
        .name_for_index(pickle_index)
        .and_then(|n| n.ok())
        .map(|n| n.into_owned())
        .unwrap_or_default();
    let prefix = pickle_name.trim_end_matches("data.pkl").to_string();
    if let Some(order) = zip.index_for_name(&format!("{prefix}byteorder")) {
        let order = archive.entry(order, "`byteorder`", budget, Some(16))?;
        if &order[..] != b"little" {
            return Err(ReadError::Unreadable("a big-endian torch file".into()));
        }
    }
    let pickle = archive.entry(pickle_index, &format!("`{pickle_name}`"), budget, None)?;
    let mut machine = Machine {
        data: &pickle,
        pos: 0,
        stack: Vec::new(),
        memo: HashMap::new(),
        cost: 0,
        budget,
        over: None,
        containers: Containers::default(),
    };
    let root = match machine.run() {
        Ok(root) => root,
        Err(e) => {
            return Err(match machine.over.take() {
                Some(over) => ReadError::OverBudget(over),
                None => ReadError::Unreadable(e),
            })
        }
    };
    // Emptied (and their cycles broken) when this function returns, once walked.
    let _containers = std::mem::take(&mut machine.containers);
    let mut walk = Walk {
        found: Vec::new(),
        skipped: Vec::new(),
        nodes: 0,
        budget,
    };
    walk.collect(&root, "", 0)?;
    let mut skipped = walk.skipped;
    for s in &mut skipped {
        if s.name.is_empty() {
            s.name = stem.to_string();
        }
    }
    let (mut entries, mut items) = (Vec::new(), Vec::new());
    for (name, value) in walk.found {
        let name = if name.is_empty() {
            stem.to_string()
        } else {
            name
        };
        let (dtype, shape, item) = match value {
            Value::Tensor(t) => (t.storage.dtype.wire(), t.shape.clone(), Item::View(t)),
            number => {
                let t = scalar(&number);
                (t.dtype, Vec::new(), Item::Number(t))
            }
        };
        entries.push(Entry { name, dtype, shape });
        items.push(item);
    }
    Ok(Pickled {
        entries,
        skipped,
        items,
        prefix,
        storages: HashMap::new(),
    })
}

impl Pickled {
    /// Read tensor `i`: a slice of its storage when it is a contiguous view, else a copy charged
    /// to `budget`. The storage is read once, on first use.
    pub(crate) fn load(
        &mut self,
        i: usize,
        archive: &mut Archive,
        budget: &mut Budget,
    ) -> Result<HostTensor, ReadError> {
        let name = &self.entries[i].name;
        let t = match &self.items[i] {
            Item::Number(t) => return Ok(t.clone()),
            Item::View(t) => t.clone(),
        };
        if !self.storages.contains_key(&t.storage.key) {
            let entry = format!("{}data/{}", self.prefix, t.storage.key);
            let index = archive.zip.index_for_name(&entry).ok_or_else(|| {
                ReadError::Unreadable(format!(
                    "`{name}`: the archive has no `{entry}`, the tensor's storage"
                ))
            })?;
            let data = archive.entry(index, &format!("the storage of `{name}`"), budget, None)?;
            self.storages.insert(t.storage.key.clone(), data);
        }
        let storage = &self.storages[&t.storage.key];
        view(&t, storage, name, budget)
    }
}

/// The elements `t` views of `storage`: shared when they are a contiguous run of it, else copied
/// (charged to `budget` first). A view may not reach outside its storage.
fn view(
    t: &TensorRef,
    storage: &Bytes,
    name: &str,
    budget: &mut Budget,
) -> Result<HostTensor, ReadError> {
    let bad = |why: String| ReadError::Unreadable(format!("`{name}`: {why}"));
    if t.stride.len() != t.shape.len() {
        return Err(bad("a tensor whose stride and size differ in length".into()));
    }
    let size = t.storage.dtype.size();
    let strided = Strided {
        offset: t.offset,
        shape: &t.shape,
        strides: &t.stride,
    };
    let numel = strided
        .numel()
        .filter(|n| n.checked_mul(size).is_some())
        .ok_or_else(|| {
            bad(format!(
                "a tensor of shape {:?} is too large to read",
                t.shape
            ))
        })?;
    let elements = storage.len() / size;
    let end = strided
        .end()
        .ok_or_else(|| bad("a tensor view overflows".into()))?;
    if numel > 0 && end > elements {
        return Err(bad(format!(
            "a tensor view reaches element {} of a storage of {elements}",
            end - 1
        )));
    }
    let data: Bytes = if strided.is_c_contiguous() {
        storage.slice(t.offset.min(elements) * size..(t.offset.min(elements) + numel) * size)
    } else {
        budget.charge_elements(
            &format!("`{name}` (a view that is not contiguous, copied)"),
            numel,
            size,
        )?;
        strided.gather(storage, size).into()
    };
    Ok(match t.storage.dtype {
        StorageType::Wire(dtype) => HostTensor {
            dtype,
            shape: t.shape.clone(),
            data,
        },
        StorageType::Narrow(narrow) => {
            budget.charge_elements(
                &format!("`{name}` ({:?} widened to {})", narrow, narrow.wide()),
                numel,
                narrow.wide().size(),
            )?;
            HostTensor {
                dtype: narrow.wide(),
                shape: t.shape.clone(),
                data: narrow.widen(&data).into(),
            }
        }
    })
}
