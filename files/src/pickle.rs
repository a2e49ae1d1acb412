//! PyTorch's `.pt`/`.pth` files (`torch.save`), read without running any pickled code.
//!
//! A file is a zip archive: `<name>/data.pkl` (a pickle of the saved object, tensors standing in as
//! references to storages) and `<name>/data/<key>` (each storage's raw bytes). Unpickling normally
//! calls whatever functions the pickle names; this reader instead interprets the opcodes itself
//! and understands only data — dicts, lists, tuples, numbers, strings — and the few torch
//! functions that rebuild a tensor from a storage. Anything else becomes an opaque value that is
//! never called, so a hostile file can fail to read, but not run code.
//!
//! Bounds: values are shared rather than copied (memo and containers hold `Rc`s), walking the
//! result visits at most [`MAX_NODES`] values, and a tensor may not claim more than
//! [`MAX_TENSOR_BYTES`] or read outside its storage.

use crate::tensor::{HostTensor, WireDType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Read;
use std::rc::Rc;

/// Largest tensor this reader builds.
pub const MAX_TENSOR_BYTES: usize = 1 << 30;
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
    I8,
}

impl StorageType {
    fn size(self) -> usize {
        match self {
            StorageType::Wire(d) => d.size(),
            StorageType::I8 => 1,
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
    /// Something this reader does not interpret (and never calls): its class or function.
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
        "CharStorage" => return Ok(StorageType::I8),
        other => return err(format!("storages of type {other} are not supported")),
    }))
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    memo: HashMap<u32, Value>,
}

impl<'a> Machine<'a> {
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

    fn run(mut self) -> Result<Value, String> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    self.u8()?; // PROTO
                }
                0x95 => {
                    self.take(8)?; // FRAME
                }
                b'.' => return self.pop(),
                b'(' => self.stack.push(Value::Mark),
                b'}' => self
                    .stack
                    .push(Value::Dict(Rc::new(RefCell::new(Vec::new())))),
                b']' => self
                    .stack
                    .push(Value::List(Rc::new(RefCell::new(Vec::new())))),
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
                    self.stack.push(Value::List(Rc::new(RefCell::new(items))));
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let pairs = pairs(items)?;
                    self.stack.push(Value::Dict(Rc::new(RefCell::new(pairs))));
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
                    self.stack.push(v);
                }
                0x81 => {
                    let _args = self.pop()?;
                    let class = self.pop()?;
                    self.stack.push(Value::Opaque(describe(&class).into()));
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
        other => format!("{other:?}").chars().take(60).collect(),
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
        return Ok(Value::Opaque(describe(&callable).into()));
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
        _ => Ok(Value::Opaque(format!("{module}.{name}").into())),
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
fn collect(
    value: &Value,
    name: &str,
    out: &mut Vec<(String, Value)>,
    skipped: &mut Vec<String>,
    budget: &mut usize,
    depth: usize,
) -> Result<(), String> {
    if *budget == 0 || depth > 64 {
        return err("the saved object is too deeply nested or too large to walk");
    }
    *budget -= 1;
    let join = |key: &str| {
        if name.is_empty() {
            key.to_string()
        } else {
            format!("{name}.{key}")
        }
    };
    match value {
        Value::Tensor(_) | Value::Int(_) | Value::Float(_) | Value::Bool(_) => {
            out.push((name.to_string(), value.clone()))
        }
        Value::Dict(d) => {
            for (k, v) in d.borrow().iter() {
                let key = match k {
                    Value::Str(s) => s.to_string(),
                    Value::Int(i) => i.to_string(),
                    other => {
                        skipped.push(format!("{name}[{}]", describe(other)));
                        continue;
                    }
                };
                collect(v, &join(&key), out, skipped, budget, depth + 1)?;
            }
        }
        Value::List(l) => {
            for (i, v) in l.borrow().iter().enumerate() {
                collect(v, &join(&i.to_string()), out, skipped, budget, depth + 1)?;
            }
        }
        Value::Tuple(t) => {
            for (i, v) in t.iter().enumerate() {
                collect(v, &join(&i.to_string()), out, skipped, budget, depth + 1)?;
            }
        }
        Value::None => {}
        Value::Opaque(what) => skipped.push(format!("`{name}` ({what})")),
        other => skipped.push(format!("`{name}` ({})", describe(other))),
    }
    Ok(())
}

/// Read a storage's elements `tensor` views into a contiguous host tensor.
fn materialise(t: &TensorRef, storage: &[u8]) -> Result<HostTensor, String> {
    let size = t.storage.dtype.size();
    let numel = t
        .shape
        .iter()
        .try_fold(1usize, |n, d| n.checked_mul(*d))
        .filter(|n| n.checked_mul(size).is_some_and(|b| b <= MAX_TENSOR_BYTES))
        .ok_or_else(|| format!("a tensor of shape {:?} is too large to read", t.shape))?;
    if t.stride.len() != t.shape.len() {
        return err("a tensor whose stride and size differ in length");
    }
    let elements = storage.len() / size;
    // Stride-0 views may repeat a storage, but not without bound (a tiny hostile file must not
    // ask for a gigabyte of copies).
    if numel > elements.max(1).saturating_mul(1024) {
        return err(format!(
            "a view of {numel} elements over a storage of {elements}"
        ));
    }
    let mut data = Vec::with_capacity(numel * size);
    if numel > 0 {
        // The furthest element the view reaches must lie inside the storage.
        let last = t
            .shape
            .iter()
            .zip(&t.stride)
            .try_fold(t.offset, |acc, (d, s)| {
                acc.checked_add((d - 1).checked_mul(*s)?)
            })
            .ok_or("a tensor view overflows")?;
        if last >= elements {
            return err(format!(
                "a tensor view reaches element {last} of a storage of {elements}"
            ));
        }
        let mut index = vec![0usize; t.shape.len()];
        for _ in 0..numel {
            let at = t.offset
                + index
                    .iter()
                    .zip(&t.stride)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            data.extend_from_slice(&storage[at * size..(at + 1) * size]);
            for axis in (0..index.len()).rev() {
                index[axis] += 1;
                if index[axis] < t.shape[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
    }
    Ok(match t.storage.dtype {
        StorageType::Wire(dtype) => HostTensor {
            dtype,
            shape: t.shape.clone(),
            data: data.into(),
        },
        StorageType::I8 => HostTensor {
            dtype: WireDType::I16,
            shape: t.shape.clone(),
            data: data
                .iter()
                .flat_map(|b| (*b as i8 as i16).to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        },
    })
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

/// What a `.pt` file holds: its tensors (and numbers, as 0-d tensors) by name, and how many other
/// values it skipped. `stem` names a file that holds a single tensor or number.
pub struct PtContents {
    /// The tensors, in the order of the saved object.
    pub tensors: Vec<(String, HostTensor)>,
    /// Values that are neither tensors nor numbers (never interpreted), by name.
    pub skipped: Vec<String>,
}

/// Read the bytes of a `.pt`/`.pth` file (`torch.save`, zip format).
pub fn read(bytes: &[u8], stem: &str) -> Result<PtContents, String> {
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| {
        format!(
            "not a zip archive ({e}); golden reads torch.save's zip format (the default since \
             PyTorch 1.6), not the legacy one"
        )
    })?;
    let pickle_name = (0..zip.len())
        .filter_map(|i| Some(zip.name_for_index(i)?.ok()?.into_owned()))
        .find(|n| n.ends_with("data.pkl"))
        .ok_or("no data.pkl in the archive: not a torch.save file")?;
    let prefix = pickle_name.trim_end_matches("data.pkl").to_string();
    let mut entry = |name: &str, limit: usize| -> Result<Vec<u8>, String> {
        let mut file = zip
            .by_name(name)
            .map_err(|e| format!("the archive has no `{name}`: {e}"))?;
        let mut out = Vec::new();
        (&mut file)
            .take(limit as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("`{name}`: {e}"))?;
        if out.len() > limit {
            return err(format!("`{name}` is larger than {limit} bytes"));
        }
        Ok(out)
    };
    if let Ok(order) = entry(&format!("{prefix}byteorder"), 16) {
        if order != b"little" {
            return err("a big-endian torch file");
        }
    }
    let pickle = entry(&pickle_name, 256 << 20)?;
    let root = Machine {
        data: &pickle,
        pos: 0,
        stack: Vec::new(),
        memo: HashMap::new(),
    }
    .run()?;
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    let mut budget = MAX_NODES;
    collect(&root, "", &mut found, &mut skipped, &mut budget, 0)?;
    let mut storages: HashMap<String, Vec<u8>> = HashMap::new();
    let mut tensors = Vec::new();
    for (name, value) in found {
        let name = if name.is_empty() {
            stem.to_string()
        } else {
            name
        };
        let tensor = match &value {
            Value::Tensor(t) => {
                if !storages.contains_key(&t.storage.key) {
                    let data = entry(&format!("{prefix}data/{}", t.storage.key), MAX_TENSOR_BYTES)?;
                    storages.insert(t.storage.key.clone(), data);
                }
                materialise(t, &storages[&t.storage.key]).map_err(|e| format!("`{name}`: {e}"))?
            }
            number => scalar(number),
        };
        tensors.push((name, tensor));
    }
    Ok(PtContents { tensors, skipped })
}
