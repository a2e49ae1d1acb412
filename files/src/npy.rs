//! NumPy's `.npy` format, for the files a failing check leaves behind and the tools that read them.
//!
//! Writing: version 1.0, the magic `\x93NUMPY`, a header dict padded to a multiple of 64 bytes,
//! then the raw little-endian data in C order. NumPy has no bf16, so bf16 tensors are written as
//! float32 copies (exact: every bf16 is a float32).
//!
//! Reading agrees with `numpy.lib.format.read_array(..., allow_pickle=False)` on which headers it
//! takes (`tests/npy_headers.rs` checks a thousand variants against the real NumPy): versions 1.0,
//! 2.0 and 3.0, a header of at most 10,000 characters that is a Python literal — parsed here as
//! Python's `ast.literal_eval` would, with its quoting, escapes, comments, continuations and
//! integer spellings, and NumPy's filter for Python 2's `L` suffix — holding exactly `descr`,
//! `fortran_order` and `shape`. Big-endian data and Fortran order are converted (charged to the
//! read budget), int8, uint16 and uint64 are widened to dtypes the wire carries; what golden does
//! not carry (object arrays above all: reading them means unpickling; records, strings, complex
//! numbers, dates) is refused with a message that says so. Bytes after the data are ignored, as
//! NumPy ignores them. No input makes the reader panic or allocate beyond its budget.

use crate::budget::{Budget, ReadError};
use crate::tensor::{swap_bytes, HostTensor, Narrow, Strided, WireDType};
use bytes::Bytes;
use std::fmt;
use std::io::Write;
use std::path::Path;

fn descr(dtype: WireDType) -> &'static str {
    match dtype {
        WireDType::F32 | WireDType::BF16 => "<f4",
        WireDType::F64 => "<f8",
        WireDType::F16 => "<f2",
        WireDType::I64 => "<i8",
        WireDType::I32 => "<i4",
        WireDType::I16 => "<i2",
        WireDType::U32 => "<u4",
        WireDType::U8 => "|u1",
        WireDType::Bool => "|b1",
    }
}

/// The bytes of an `.npy` file holding `t`.
pub fn encode(t: &HostTensor) -> Vec<u8> {
    let shape = match t.shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", t.shape[0]),
        _ => format!(
            "({})",
            t.shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(t.dtype)
    );
    // magic (6) + version (2) + header length (2) + header + '\n', a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.data.len() * 2);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    if t.dtype == WireDType::BF16 {
        for v in t.to_f64() {
            out.extend_from_slice(&(v as f32).to_le_bytes());
        }
    } else {
        out.extend_from_slice(&t.data);
    }
    out
}

/// Why bytes are not an `.npy` file golden can read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyError(pub String);

impl fmt::Display for NpyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a readable .npy file: {}", self.0)
    }
}

impl std::error::Error for NpyError {}

fn npy_err<T>(msg: impl Into<String>) -> Result<T, NpyError> {
    Err(NpyError(msg.into()))
}

/// Most characters a header may have: NumPy refuses longer ones unless the file is trusted with
/// `allow_pickle=True` (`numpy.lib.format`'s `max_header_size`).
pub const MAX_HEADER_CHARS: usize = 10_000;

const MAGIC: &[u8] = b"\x93NUMPY";

/// The element type a header's `descr` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Elem {
    Wire(WireDType),
    /// A width the wire format lacks: read and widened.
    Narrow(Narrow),
}

impl Elem {
    fn size(self) -> usize {
        match self {
            Elem::Wire(d) => d.size(),
            Elem::Narrow(n) => n.size(),
        }
    }
    fn dtype(self) -> WireDType {
        match self {
            Elem::Wire(d) => d,
            Elem::Narrow(n) => n.wide(),
        }
    }
}

/// An `.npy` header: what the data holds and where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Format version: 1, 2 or 3.
    pub version: u8,
    /// The `descr` as written (`<f4`, `float32`, ...).
    pub descr: String,
    /// The dtype golden reads the data as (int8, uint16 and uint64 are widened to int16, int32 and
    /// float64, which the wire format has).
    pub dtype: WireDType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Whether the data is in Fortran (column-major) order.
    pub fortran_order: bool,
    /// Whether the data is big-endian.
    pub big_endian: bool,
    /// Byte offset of the data in the file.
    pub data_start: usize,
    elem: Elem,
    numel: usize,
}

impl Header {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Bytes of data the header asks for (checked not to overflow).
    pub fn data_len(&self) -> usize {
        self.numel * self.elem.size()
    }
}

/// How many bytes at the start of a file hold its magic, version and header, from its first
/// bytes (the first 12 are enough). Refuses a wrong magic, a version NumPy does not read and a
/// header longer than NumPy reads, before anything of that length is read.
pub fn header_end(start: &[u8]) -> Result<usize, NpyError> {
    let short = || NpyError("the file ends inside its magic, version or header length".into());
    if !start.starts_with(MAGIC) {
        if MAGIC.starts_with(start) {
            return Err(short());
        }
        return npy_err("no \\x93NUMPY magic");
    }
    let (major, minor) = match start.get(6..8) {
        Some(v) => (v[0], v[1]),
        None => return Err(short()),
    };
    let (len_bytes, max_bytes) = match (major, minor) {
        (1, 0) => (2, MAX_HEADER_CHARS),
        (2, 0) => (4, MAX_HEADER_CHARS),
        // UTF-8: at most 4 bytes a character.
        (3, 0) => (4, 4 * MAX_HEADER_CHARS),
        _ => {
            return npy_err(format!(
                "format version {major}.{minor} (NumPy writes and reads 1.0, 2.0 and 3.0)"
            ))
        }
    };
    let field = start.get(8..8 + len_bytes).ok_or_else(short)?;
    let header_len = field
        .iter()
        .rev()
        .fold(0usize, |n, b| (n << 8) | usize::from(*b));
    if header_len > max_bytes {
        return npy_err(format!(
            "a header of {header_len} bytes: NumPy reads headers of at most {MAX_HEADER_CHARS} \
             characters from files it does not trust"
        ));
    }
    Ok(8 + len_bytes + header_len)
}

/// Parse the header of an `.npy` file from its first bytes (at least [`header_end`] of them), as
/// `numpy.lib.format.read_array(..., allow_pickle=False)` does: the header is a Python literal
/// (read here without Python: dicts, tuples, lists, strings, integers, booleans and None, with
/// Python's spelling of each), a dict of exactly `descr`, `fortran_order` and `shape`.
pub fn parse_header(bytes: &[u8]) -> Result<Header, NpyError> {
    let end = header_end(bytes)?;
    let raw = bytes
        .get(..end)
        .ok_or_else(|| NpyError("the header runs past the end of the file".into()))?;
    let version = raw[6];
    let start = if version == 1 { 10 } else { 12 };
    let text: String = if version == 3 {
        std::str::from_utf8(&raw[start..])
            .map_err(|_| NpyError("the header is not UTF-8 (format version 3.0)".into()))?
            .to_string()
    } else {
        // Versions 1.0 and 2.0 are latin-1: each byte is one character.
        raw[start..].iter().map(|b| char::from(*b)).collect()
    };
    if text.chars().count() > MAX_HEADER_CHARS {
        return npy_err(format!(
            "a header of {} characters: NumPy reads headers of at most {MAX_HEADER_CHARS} from \
             files it does not trust",
            text.chars().count()
        ));
    }
    let bad = |why: String| NpyError(format!("the header {} {why}", excerpt(&text)));
    let dict = literal::parse(&text, version <= 2)
        .map_err(|e| bad(format!("is not a Python literal NumPy reads: {e}")))?;
    let literal::Lit::Dict(pairs) = dict else {
        return Err(bad("is not a dict".into()));
    };
    let mut descr = None;
    let mut fortran = None;
    let mut shape = None;
    let mut keys = Vec::new();
    for (k, v) in pairs {
        let name = match &k {
            literal::Lit::Str(s) => s.clone(),
            other => format!("{other:?}"),
        };
        match name.as_str() {
            "descr" if matches!(k, literal::Lit::Str(_)) => descr = Some(v),
            "fortran_order" if matches!(k, literal::Lit::Str(_)) => fortran = Some(v),
            "shape" if matches!(k, literal::Lit::Str(_)) => shape = Some(v),
            _ => {}
        }
        if !keys.contains(&name) {
            keys.push(name);
        }
    }
    let (Some(descr), Some(fortran), Some(shape)) = (descr, fortran, shape) else {
        return Err(bad(format!(
            "has the keys {keys:?}, not exactly 'descr', 'fortran_order' and 'shape'"
        )));
    };
    if keys.len() != 3 {
        return Err(bad(format!(
            "has the keys {keys:?}, not exactly 'descr', 'fortran_order' and 'shape'"
        )));
    }
    let literal::Lit::Tuple(dims) = &shape else {
        return Err(bad(format!("has a shape that is not a tuple: {shape:?}")));
    };
    let shape: Vec<usize> = dims
        .iter()
        .map(|d| match d {
            literal::Lit::Int(Some(n)) if *n >= 0 => usize::try_from(*n)
                .map_err(|_| bad(format!("has a size {n} this machine cannot address"))),
            literal::Lit::Int(Some(n)) => Err(bad(format!("has a negative size {n}"))),
            literal::Lit::Int(None) => Err(bad("has a size beyond 64 bits".into())),
            other => Err(bad(format!("has a size that is not an integer: {other:?}"))),
        })
        .collect::<Result<_, _>>()?;
    if shape.len() > crate::tensor::MAX_NDIM {
        return Err(bad(format!(
            "has {} axes: golden reads at most {}",
            shape.len(),
            crate::tensor::MAX_NDIM
        )));
    }
    let literal::Lit::Bool(fortran_order) = fortran else {
        return Err(bad(format!(
            "has a fortran_order that is not True or False: {fortran:?}"
        )));
    };
    let descr = match descr {
        literal::Lit::Str(s) => s,
        literal::Lit::Tuple(_) | literal::Lit::List(_) => {
            return Err(bad(
                "has a structured or subarray dtype, which golden does not read (it reads \
                 arrays of one plain dtype)"
                    .into(),
            ))
        }
        other => return Err(bad(format!("has a descr that is not a dtype: {other:?}"))),
    };
    let (elem, big_endian) = parse_descr(&descr)?;
    // NumPy refuses an array whose item size times its non-zero sizes overflows 63 bits, even
    // when another size is zero.
    shape
        .iter()
        .filter(|d| **d != 0)
        .try_fold(elem.size(), |n, d| n.checked_mul(*d))
        .filter(|n| i64::try_from(*n).is_ok())
        .ok_or_else(|| bad("has a shape whose size in bytes overflows".into()))?;
    let numel = shape.iter().product();
    Ok(Header {
        version,
        descr,
        dtype: elem.dtype(),
        shape,
        fortran_order,
        big_endian: big_endian && elem.size() > 1,
        data_start: end,
        elem,
        numel,
    })
}

/// The start of a header, for messages.
fn excerpt(text: &str) -> String {
    let cut: String = text.trim_end().chars().take(80).collect();
    if cut.chars().count() < text.trim_end().chars().count() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// The element type and byte order of a `descr` string, for the dtypes golden reads.
fn parse_descr(descr: &str) -> Result<(Elem, bool), NpyError> {
    use WireDType::*;
    let wire = Elem::Wire;
    let named = match descr {
        "bool" => Some(wire(Bool)),
        "float16" => Some(wire(F16)),
        "float32" => Some(wire(F32)),
        "float64" => Some(wire(F64)),
        "int8" => Some(Elem::Narrow(Narrow::I8)),
        "int16" => Some(wire(I16)),
        "int32" => Some(wire(I32)),
        "int64" => Some(wire(I64)),
        "uint8" => Some(wire(U8)),
        "uint16" => Some(Elem::Narrow(Narrow::U16)),
        "uint32" => Some(wire(U32)),
        "uint64" => Some(Elem::Narrow(Narrow::U64)),
        _ => None,
    };
    if let Some(elem) = named {
        return Ok((elem, false));
    }
    let (big, code) = match descr.as_bytes().first() {
        Some(b'>') => (true, &descr[1..]),
        Some(b'<' | b'=' | b'|') => (false, &descr[1..]),
        _ => (false, descr),
    };
    let elem = match code {
        "b1" | "?" => wire(Bool),
        "f2" | "e" => wire(F16),
        "f4" | "f" => wire(F32),
        "f8" | "d" => wire(F64),
        "i1" | "b" => Elem::Narrow(Narrow::I8),
        "i2" | "h" => wire(I16),
        "i4" | "i" => wire(I32),
        "i8" | "q" => wire(I64),
        "u1" | "B" => wire(U8),
        "u2" | "H" => Elem::Narrow(Narrow::U16),
        "u4" | "I" => wire(U32),
        "u8" | "Q" => Elem::Narrow(Narrow::U64),
        _ => return Err(NpyError(unsupported_descr(descr))),
    };
    Ok((elem, big))
}

/// Why golden does not read a dtype (which NumPy may or may not know).
fn unsupported_descr(descr: &str) -> String {
    let code = descr.trim_start_matches(['<', '>', '=', '|']);
    let what = if code.contains('O') || code.starts_with("object") {
        "an object array (reading it would mean unpickling)"
    } else if code.starts_with(['c', 'F', 'D', 'G']) || code.starts_with("complex") {
        "complex numbers"
    } else if code.starts_with(['S', 'U', 'a'])
        || code.starts_with("str")
        || code.starts_with("bytes")
    {
        "strings"
    } else if code.starts_with('V') || code.starts_with("void") {
        "raw records (void)"
    } else if code.starts_with(['M', 'm'])
        || code.starts_with("datetime")
        || code.starts_with("timedelta")
    {
        "dates or times"
    } else if matches!(
        code,
        "l" | "L"
            | "p"
            | "P"
            | "n"
            | "N"
            | "int"
            | "uint"
            | "long"
            | "ulong"
            | "intp"
            | "uintp"
            | "int_"
            | "uint_"
    ) {
        "an integer whose width depends on the platform"
    } else if matches!(
        code,
        "g" | "f16" | "f12" | "f10" | "longdouble" | "float128" | "float96"
    ) {
        "extended-precision floats"
    } else {
        "not a dtype golden knows"
    };
    format!(
        "dtype `{descr}` ({what}) is not one golden reads: it reads bool, float16/32/64, \
         int8/16/32/64 and uint8/16/32/64, in either byte order"
    )
}

/// Read an `.npy` file's bytes, sharing them: the tensor's data is a slice of `bytes` unless the
/// file is big-endian, in Fortran order or of a narrow integer dtype, whose copies are charged to
/// `budget` before they are made. Bytes after the data are ignored, as NumPy ignores them.
pub fn decode_shared(bytes: Bytes, budget: &mut Budget) -> Result<HostTensor, ReadError> {
    let header = parse_header(&bytes).map_err(|e| ReadError::Unreadable(e.to_string()))?;
    from_header(&header, bytes, budget, "the data")
}

/// The tensor of a parsed header over the file's bytes (`what` names it in a budget error).
pub(crate) fn from_header(
    header: &Header,
    bytes: Bytes,
    budget: &mut Budget,
    what: &str,
) -> Result<HostTensor, ReadError> {
    let need = header.data_len();
    let have = bytes.len().saturating_sub(header.data_start);
    if have < need {
        return Err(ReadError::Unreadable(
            NpyError(format!(
                "shape {:?} of {} needs {need} bytes of data, the file has {have}",
                header.shape, header.descr
            ))
            .to_string(),
        ));
    }
    let size = header.elem.size();
    let mut data = bytes.slice(header.data_start..header.data_start + need);
    if header.fortran_order && header.shape.iter().filter(|d| **d > 1).count() > 1 {
        // Column-major: element [i, j, k] is at i + s0·j + s0·s1·k.
        let mut strides = Vec::with_capacity(header.shape.len());
        let mut step = 1usize;
        for d in &header.shape {
            strides.push(step);
            step = step.saturating_mul(*d);
        }
        budget.charge_elements(
            &format!("{what} (in Fortran order, copied to C order)"),
            header.numel,
            size,
        )?;
        let view = Strided {
            offset: 0,
            shape: &header.shape,
            strides: &strides,
        };
        data = view.gather(&data, size).into();
    }
    if header.big_endian {
        budget.charge(
            &format!("{what} (big-endian, copied to little-endian)"),
            need as u64,
        )?;
        data = swap_bytes(&data, size).into();
    }
    if let Elem::Narrow(narrow) = header.elem {
        budget.charge_elements(
            &format!("{what} ({} widened to {})", header.descr, narrow.wide()),
            header.numel,
            narrow.wide().size(),
        )?;
        data = narrow.widen(&data).into();
    }
    Ok(HostTensor {
        dtype: header.dtype,
        shape: header.shape.clone(),
        data,
    })
}

/// Read the bytes of an `.npy` file (copied; its default read budget applies).
pub fn decode(bytes: &[u8]) -> Result<HostTensor, NpyError> {
    let mut budget = Budget::for_file(bytes.len() as u64);
    decode_shared(Bytes::copy_from_slice(bytes), &mut budget).map_err(|e| match e {
        ReadError::Unreadable(why) => NpyError(
            why.strip_prefix("not a readable .npy file: ")
                .unwrap_or(&why)
                .to_string(),
        ),
        ReadError::OverBudget(over) => NpyError(over.to_string()),
    })
}

/// Read an `.npy` file, with its default read budget.
pub fn read(path: &Path) -> Result<HostTensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut budget = Budget::for_file(bytes.len() as u64);
    decode_shared(bytes.into(), &mut budget).map_err(|e| format!("{}: {e}", path.display()))
}

/// Python literals as `ast.literal_eval` reads them, for `.npy` headers: dicts, tuples, lists,
/// strings (every quoting, prefix, escape and implicit concatenation), integers (decimal, hex,
/// octal, binary, underscores, a sign, and Python 2's `L` suffix where NumPy filters it out),
/// `True`, `False` and `None`, with comments, line continuations and the indentation rule of
/// Python's parser. Anything else (floats, sets, names, expressions) is refused: NumPy refuses
/// every header holding one, as it can be neither a key, a shape, a flag nor a plain dtype.
mod literal {
    /// A parsed value.
    #[derive(Clone, Debug, PartialEq)]
    pub enum Lit {
        Str(String),
        Bytes,
        /// An integer, or None when it does not fit in 64 bits.
        Int(Option<i64>),
        Bool(bool),
        None,
        Tuple(Vec<Lit>),
        List(Vec<Lit>),
        Dict(Vec<(Lit, Lit)>),
    }

    #[derive(Clone, Debug, PartialEq)]
    enum Tok {
        Open(char),
        Close(char),
        Comma,
        Colon,
        Sign(bool),
        Str(String),
        Bytes,
        Int(Option<i64>),
        Name(String),
        End,
    }

    /// How a value was written: a sign applies to a bare number only, once.
    #[derive(Clone, Copy, PartialEq)]
    enum Origin {
        Number,
        Signed,
        Other,
    }

    /// Deeper nesting is refused, as Python's parser refuses 200 nested brackets.
    const MAX_DEPTH: usize = 200;

    struct Lexer {
        chars: Vec<char>,
        pos: usize,
        /// Open brackets: inside them, newlines are spaces.
        depth: usize,
        /// Whether the logical line of the value has ended (a newline outside brackets).
        line_done: bool,
        /// After that, the indentation of the current line, and whether it has a comment: Python
        /// refuses a last line of spaces without its newline.
        trailing_col: usize,
        trailing_comment: bool,
        /// Python 2's `L` after an integer is dropped (versions 1.0 and 2.0).
        python2: bool,
        /// The last token was an integer, with only spaces since.
        after_number: bool,
        peeked: Option<Tok>,
    }

    pub fn parse(text: &str, python2: bool) -> Result<Lit, String> {
        if text.contains('\0') {
            return Err("it holds a NUL character".into());
        }
        // literal_eval strips leading spaces and tabs; then Python's parser skips blank lines and
        // refuses an indented first line.
        let text = text.trim_start_matches([' ', '\t']);
        let chars: Vec<char> = text.chars().collect();
        let mut pos = 0;
        loop {
            // The indentation of a line as Python's tokenizer measures it: a form feed resets
            // it, and a line continued with a backslash keeps the column where the backslash was
            // (unless that was the first column).
            let mut col = 0usize;
            let mut continued_at = 0usize;
            while let Some(c) = chars.get(pos) {
                match c {
                    ' ' => col += 1,
                    '\t' => col = (col / 8 + 1) * 8,
                    '\x0c' => col = 0,
                    '\\' if matches!(chars.get(pos + 1), Some('\n' | '\r')) => {
                        if continued_at == 0 {
                            continued_at = col;
                        }
                        if chars.get(pos + 1) == Some(&'\r') && chars.get(pos + 2) == Some(&'\n') {
                            pos += 1;
                        }
                        pos += 1;
                        if pos + 1 >= chars.len() {
                            return Err("it ends with a line continuation".into());
                        }
                    }
                    _ => break,
                }
                pos += 1;
            }
            if continued_at != 0 {
                col = continued_at;
            }
            match chars.get(pos) {
                None => return Err("it is empty".into()),
                Some('\n' | '\r') => pos += 1,
                Some('#') => {
                    while chars.get(pos).is_some_and(|c| !matches!(c, '\n' | '\r')) {
                        pos += 1;
                    }
                }
                Some(_) if col > 0 => return Err("its first line is indented".into()),
                Some(_) => break,
            }
        }
        let mut lexer = Lexer {
            chars,
            pos,
            depth: 0,
            line_done: false,
            trailing_col: 0,
            trailing_comment: false,
            python2,
            after_number: false,
            peeked: None,
        };
        let (value, _) = lexer.value(0)?;
        match lexer.next()? {
            Tok::End => Ok(value),
            Tok::Comma => Err("it is a tuple, not a dict".into()),
            other => Err(format!("{other:?} follows the value")),
        }
    }

    impl Lexer {
        fn peek(&mut self) -> Result<&Tok, String> {
            if self.peeked.is_none() {
                let t = self.lex()?;
                self.peeked = Some(t);
            }
            Ok(self.peeked.as_ref().unwrap())
        }

        fn next(&mut self) -> Result<Tok, String> {
            match self.peeked.take() {
                Some(t) => Ok(t),
                None => self.lex(),
            }
        }

        fn at(&self, offset: usize) -> Option<char> {
            self.chars.get(self.pos + offset).copied()
        }

        /// Skip spaces, comments, continuations and (inside brackets) newlines.
        fn space(&mut self) -> Result<(), String> {
            while let Some(c) = self.at(0) {
                match c {
                    ' ' => {
                        self.trailing_col += 1;
                        self.pos += 1;
                    }
                    '\t' => {
                        self.trailing_col = (self.trailing_col / 8 + 1) * 8;
                        self.pos += 1;
                    }
                    '\x0c' => {
                        self.trailing_col = 0;
                        self.pos += 1;
                    }
                    '\\' if matches!(self.at(1), Some('\n' | '\r')) => {
                        self.pos += if self.at(1) == Some('\r') && self.at(2) == Some('\n') {
                            3
                        } else {
                            2
                        };
                        if self.at(0).is_none() {
                            return Err("it ends with a line continuation".into());
                        }
                    }
                    '#' => {
                        self.after_number = false;
                        self.trailing_comment = true;
                        while self.at(0).is_some_and(|c| !matches!(c, '\n' | '\r')) {
                            self.pos += 1;
                        }
                    }
                    '\n' | '\r' => {
                        self.after_number = false;
                        if self.depth == 0 {
                            self.line_done = true;
                        }
                        self.trailing_col = 0;
                        self.trailing_comment = false;
                        self.pos += 1;
                    }
                    _ => break,
                }
            }
            Ok(())
        }

        fn lex(&mut self) -> Result<Tok, String> {
            loop {
                self.space()?;
                let Some(c) = self.at(0) else {
                    if self.line_done && self.trailing_col > 0 && !self.trailing_comment {
                        return Err("its last line is indented and has no newline".into());
                    }
                    return Ok(Tok::End);
                };
                if self.line_done {
                    return Err(format!("`{c}` after the end of the value's line"));
                }
                let was_number = std::mem::replace(&mut self.after_number, false);
                let tok = match c {
                    '{' | '(' | '[' => {
                        self.pos += 1;
                        self.depth += 1;
                        if self.depth > MAX_DEPTH {
                            return Err("it nests too deeply".into());
                        }
                        Tok::Open(c)
                    }
                    '}' | ')' | ']' => {
                        self.pos += 1;
                        self.depth = self.depth.saturating_sub(1);
                        Tok::Close(c)
                    }
                    ',' => {
                        self.pos += 1;
                        Tok::Comma
                    }
                    ':' => {
                        self.pos += 1;
                        Tok::Colon
                    }
                    '+' | '-' => {
                        self.pos += 1;
                        Tok::Sign(c == '-')
                    }
                    '0'..='9' => {
                        let t = self.number()?;
                        self.after_number = true;
                        t
                    }
                    '.' if self.at(1).is_some_and(|d| d.is_ascii_digit()) => {
                        return Err("it holds a float".into())
                    }
                    '\'' | '"' => self.string(false, false)?,
                    c if c.is_ascii_alphabetic() || c == '_' => {
                        let start = self.pos;
                        while self
                            .at(0)
                            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                        {
                            self.pos += 1;
                        }
                        let name: String = self.chars[start..self.pos].iter().collect();
                        if matches!(self.at(0), Some('\'' | '"')) {
                            let lower = name.to_ascii_lowercase();
                            match lower.as_str() {
                                "r" | "u" => self.string(lower == "r", false)?,
                                "b" => self.string(false, true)?,
                                "br" | "rb" => self.string(true, true)?,
                                _ => return Err(format!("a string with prefix `{name}`")),
                            }
                        } else if self.at(0).is_some_and(|c| !c.is_ascii()) {
                            return Err("a name with a character beyond ASCII".into());
                        } else if name == "L" && self.python2 && was_number {
                            // NumPy's filter for Python 2 headers drops an `L` after a number.
                            continue;
                        } else {
                            Tok::Name(name)
                        }
                    }
                    other => return Err(format!("the character {other:?}")),
                };
                return Ok(tok);
            }
        }

        /// An integer literal (anything else that starts with a digit is refused).
        fn number(&mut self) -> Result<Tok, String> {
            let start = self.pos;
            while let Some(c) = self.at(0) {
                let exponent_sign = matches!(c, '+' | '-')
                    && matches!(self.chars.get(self.pos.wrapping_sub(1)), Some('e' | 'E'))
                    && self.pos > start;
                if c.is_ascii_alphanumeric() || c == '_' || c == '.' || exponent_sign {
                    self.pos += 1;
                } else {
                    break;
                }
            }
            let run: String = self.chars[start..self.pos].iter().collect();
            if let Some(v) = int(&run) {
                return Ok(Tok::Int(v));
            }
            if self.python2 {
                if let Some(v) = run.strip_suffix('L').and_then(int) {
                    return Ok(Tok::Int(v));
                }
            }
            Err(format!("`{run}`, which is not an integer"))
        }

        /// A string literal from its opening quote; `raw` and `bytes` from its prefix.
        fn string(&mut self, raw: bool, bytes: bool) -> Result<Tok, String> {
            let q = self.at(0).unwrap();
            let triple = self.at(1) == Some(q) && self.at(2) == Some(q);
            self.pos += if triple { 3 } else { 1 };
            let mut out = String::new();
            loop {
                let Some(c) = self.at(0) else {
                    return Err("a string that is not closed".into());
                };
                if c == q && (!triple || (self.at(1) == Some(q) && self.at(2) == Some(q))) {
                    self.pos += if triple { 3 } else { 1 };
                    break;
                }
                if !triple && matches!(c, '\n' | '\r') {
                    return Err("a string that is not closed on its line".into());
                }
                if bytes && !c.is_ascii() {
                    return Err("a bytes literal with a character beyond ASCII".into());
                }
                self.pos += 1;
                if c != '\\' {
                    out.push(c);
                    continue;
                }
                let Some(e) = self.at(0) else {
                    return Err("a string that is not closed".into());
                };
                if raw {
                    if matches!(e, '\n' | '\r') {
                        return Err("a raw string continued on the next line".into());
                    }
                    out.push('\\');
                    out.push(e);
                    self.pos += 1;
                    continue;
                }
                self.pos += 1;
                let simple = match e {
                    '\n' => Some(None),
                    '\r' => {
                        if self.at(0) == Some('\n') {
                            self.pos += 1;
                        }
                        Some(None)
                    }
                    '\\' | '\'' | '"' => Some(Some(e)),
                    'a' => Some(Some('\x07')),
                    'b' => Some(Some('\x08')),
                    'f' => Some(Some('\x0c')),
                    'n' => Some(Some('\n')),
                    'r' => Some(Some('\r')),
                    't' => Some(Some('\t')),
                    'v' => Some(Some('\x0b')),
                    _ => None,
                };
                if let Some(ch) = simple {
                    out.extend(ch);
                    continue;
                }
                let hex = |lexer: &mut Lexer, n: usize| -> Result<u32, String> {
                    let digits: String = (0..n).filter_map(|k| lexer.at(k)).collect();
                    if digits.len() != n || !digits.chars().all(|d| d.is_ascii_hexdigit()) {
                        return Err(format!("a truncated \\{e} escape"));
                    }
                    lexer.pos += n;
                    Ok(u32::from_str_radix(&digits, 16).unwrap())
                };
                let code = match e {
                    '0'..='7' => {
                        let mut v = e.to_digit(8).unwrap();
                        for _ in 0..2 {
                            match self.at(0).and_then(|d| d.to_digit(8)) {
                                Some(d) => {
                                    v = v * 8 + d;
                                    self.pos += 1;
                                }
                                None => break,
                            }
                        }
                        v
                    }
                    'x' => hex(self, 2)?,
                    'u' if !bytes => hex(self, 4)?,
                    'U' if !bytes => hex(self, 8)?,
                    'N' if !bytes => {
                        return Err("a \\N{...} escape, which golden does not read".into())
                    }
                    other => {
                        // Python keeps an unknown escape as it is.
                        out.push('\\');
                        out.push(other);
                        continue;
                    }
                };
                out.push(
                    char::from_u32(code)
                        .ok_or_else(|| format!("the escape of U+{code:X}, not a character"))?,
                );
            }
            Ok(if bytes { Tok::Bytes } else { Tok::Str(out) })
        }

        /// A value at nesting `depth`, and how it was written.
        fn value(&mut self, depth: usize) -> Result<(Lit, Origin), String> {
            if depth > MAX_DEPTH {
                return Err("it nests too deeply".into());
            }
            Ok(match self.next()? {
                Tok::Sign(negative) => {
                    let (v, origin) = self.value(depth + 1)?;
                    match (v, origin) {
                        (Lit::Int(n), Origin::Number) => (
                            Lit::Int(if negative {
                                n.and_then(i64::checked_neg)
                            } else {
                                n
                            }),
                            Origin::Signed,
                        ),
                        _ => return Err("a sign before something that is not a number".into()),
                    }
                }
                Tok::Int(n) => (Lit::Int(n), Origin::Number),
                Tok::Str(mut s) => {
                    loop {
                        match self.peek()? {
                            Tok::Str(_) => {
                                if let Tok::Str(more) = self.next()? {
                                    s.push_str(&more);
                                }
                            }
                            Tok::Bytes => return Err("a string followed by bytes".into()),
                            _ => break,
                        }
                    }
                    (Lit::Str(s), Origin::Other)
                }
                Tok::Bytes => {
                    loop {
                        match self.peek()? {
                            Tok::Bytes => {
                                self.next()?;
                            }
                            Tok::Str(_) => return Err("bytes followed by a string".into()),
                            _ => break,
                        }
                    }
                    (Lit::Bytes, Origin::Other)
                }
                Tok::Name(name) => (
                    match name.as_str() {
                        "True" => Lit::Bool(true),
                        "False" => Lit::Bool(false),
                        "None" => Lit::None,
                        other => return Err(format!("the name `{other}`")),
                    },
                    Origin::Other,
                ),
                Tok::Open('(') => {
                    if self.peek()? == &Tok::Close(')') {
                        self.next()?;
                        return Ok((Lit::Tuple(Vec::new()), Origin::Other));
                    }
                    let first = self.value(depth + 1)?;
                    if self.peek()? != &Tok::Comma {
                        self.close(')')?;
                        return Ok(first);
                    }
                    let items = self.items(first.0, ')', depth)?;
                    (Lit::Tuple(items), Origin::Other)
                }
                Tok::Open('[') => {
                    if self.peek()? == &Tok::Close(']') {
                        self.next()?;
                        return Ok((Lit::List(Vec::new()), Origin::Other));
                    }
                    let first = self.value(depth + 1)?.0;
                    if self.peek()? != &Tok::Comma {
                        self.close(']')?;
                        return Ok((Lit::List(vec![first]), Origin::Other));
                    }
                    (Lit::List(self.items(first, ']', depth)?), Origin::Other)
                }
                Tok::Open(_) => {
                    let mut pairs = Vec::new();
                    if self.peek()? == &Tok::Close('}') {
                        self.next()?;
                        return Ok((Lit::Dict(pairs), Origin::Other));
                    }
                    loop {
                        let key = self.value(depth + 1)?.0;
                        if self.next()? != Tok::Colon {
                            return Err("a set, or a dict entry without `:`".into());
                        }
                        let value = self.value(depth + 1)?.0;
                        pairs.push((key, value));
                        match self.next()? {
                            Tok::Comma => {
                                if self.peek()? == &Tok::Close('}') {
                                    self.next()?;
                                    break;
                                }
                            }
                            Tok::Close('}') => break,
                            other => return Err(format!("{other:?} inside a dict")),
                        }
                    }
                    (Lit::Dict(pairs), Origin::Other)
                }
                other => return Err(format!("{other:?} where a value belongs")),
            })
        }

        /// The rest of a tuple or list after its first item, up to and with its closing bracket.
        fn items(&mut self, first: Lit, close: char, depth: usize) -> Result<Vec<Lit>, String> {
            let mut items = vec![first];
            loop {
                match self.next()? {
                    Tok::Comma => {
                        if self.peek()? == &Tok::Close(close) {
                            self.next()?;
                            return Ok(items);
                        }
                        items.push(self.value(depth + 1)?.0);
                    }
                    Tok::Close(c) if c == close => return Ok(items),
                    other => return Err(format!("{other:?} inside a sequence")),
                }
            }
        }

        fn close(&mut self, close: char) -> Result<(), String> {
            match self.next()? {
                Tok::Close(c) if c == close => Ok(()),
                other => Err(format!("{other:?} where `{close}` belongs")),
            }
        }
    }

    /// A Python 3 integer literal's value (None inside: beyond 64 bits), or None if `run` is not
    /// one.
    fn int(run: &str) -> Option<Option<i64>> {
        let lower = run.to_ascii_lowercase();
        let (radix, digits) = match lower.get(..2) {
            Some("0x") => (16, &run[2..]),
            Some("0o") => (8, &run[2..]),
            Some("0b") => (2, &run[2..]),
            _ => (10, run),
        };
        if digits.is_empty()
            || digits.ends_with('_')
            || digits.contains("__")
            || (radix == 10 && digits.starts_with('_'))
        {
            return None;
        }
        if radix == 10 && digits.starts_with('0') && digits.chars().any(|c| c != '0' && c != '_') {
            // Leading zeros are refused in decimal (`007`), but `0`, `00` and `0_0` are zero.
            return None;
        }
        let mut value: u128 = 0;
        let mut overflow = false;
        for c in digits.chars().filter(|c| *c != '_') {
            let d = c.to_digit(radix)?;
            match value
                .checked_mul(u128::from(radix))
                .and_then(|v| v.checked_add(u128::from(d)))
            {
                Some(v) => value = v,
                None => overflow = true,
            }
        }
        Some(if overflow {
            None
        } else {
            i64::try_from(value).ok()
        })
    }
}

/// Write `t` to `path` as `.npy`.
pub fn write(path: &Path, t: &HostTensor) -> std::io::Result<()> {
    std::fs::File::create(path)?.write_all(&encode(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float_tensor(shape: Vec<usize>, values: &[f64], dtype: WireDType) -> HostTensor {
        HostTensor::from_floats(shape, values, dtype)
    }

    #[test]
    fn round_trips_every_dtype_and_rank() {
        for dtype in [
            WireDType::F32,
            WireDType::F64,
            WireDType::F16,
            WireDType::U8,
            WireDType::U32,
            WireDType::I64,
            WireDType::I32,
            WireDType::I16,
            WireDType::Bool,
        ] {
            for shape in [vec![], vec![0], vec![5], vec![2, 3, 4]] {
                let n: usize = shape.iter().product();
                let data: Vec<u8> = (0..n * dtype.size()).map(|i| (i % 2) as u8).collect();
                let t = HostTensor {
                    dtype,
                    shape: shape.clone(),
                    data: data.into(),
                };
                let back = decode(&encode(&t)).unwrap();
                assert_eq!(
                    (back.dtype, &back.shape, &back.data),
                    (t.dtype, &t.shape, &t.data)
                );
            }
        }
    }

    #[test]
    fn refuses_what_it_cannot_read_without_panicking() {
        let good = encode(&float_tensor(vec![2, 2], &[1.0; 4], WireDType::F32));
        let header_len = u16::from_le_bytes([good[8], good[9]]) as usize;
        let with_header = |h: &str| {
            let mut b = good[..10].to_vec();
            b.extend_from_slice(h.as_bytes());
            b.extend_from_slice(&good[10 + header_len..]);
            b[8..10].copy_from_slice(&(h.len() as u16).to_le_bytes());
            b
        };
        let cases = [
            ("{'descr': '|O', 'fortran_order': False, 'shape': (2, 2), }", "unpickling"),
            ("{'descr': '<c8', 'fortran_order': False, 'shape': (2, 1), }", "complex numbers"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", "needs 24 bytes"),
            ("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 2), }", "not True or False"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 2], }", "not a tuple"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, -2), }", "negative"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), 'x': 1}", "not exactly"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (02, 2), }", "not an integer"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }, ", "a tuple"),
            ("  {'descr': '<f4', 'fortran_order': False, 'shape': (2, 2)}\n x", "after the end"),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 9999999999), }",
                "overflows",
            ),
            ("{'descr': '<f4', 'fortran_order': False}", "not exactly 'descr'"),
        ];
        for (header, why) in cases {
            let e = decode(&with_header(header)).unwrap_err().to_string();
            assert!(e.contains(why), "{header}: {e}");
        }
        for end in 0..good.len() {
            assert!(decode(&good[..end]).is_err(), "truncated at {end}");
        }
    }

    /// The header of `encode`'s file for `values` (f32, shape [2, 3]) replaced by `header`.
    fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn big_endian_fortran_and_narrow_dtypes_read_as_numpy_sees_them() {
        // [[0, 1, 2], [3, 4, 5]] as big-endian float32 in Fortran order: 0, 3, 1, 4, 2, 5.
        let data: Vec<u8> = [0.0f32, 3.0, 1.0, 4.0, 2.0, 5.0]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        let t = decode(&with_header(
            "{'descr': '>f4', 'fortran_order': True, 'shape': (2, 3), }",
            &data,
        ))
        .unwrap();
        assert_eq!((t.dtype, &t.shape), (WireDType::F32, &vec![2, 3]));
        assert_eq!(t.to_f64(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        // int8 is widened to int16, uint16 to int32.
        let t = decode(&with_header(
            "{'descr': '|i1', 'fortran_order': False, 'shape': (3,), }",
            &[0xff, 0, 7],
        ))
        .unwrap();
        assert_eq!(
            (t.dtype, t.to_f64()),
            (WireDType::I16, vec![-1.0, 0.0, 7.0])
        );
        let t = decode(&with_header(
            "{'descr': '>u2', 'fortran_order': False, 'shape': (1,), }",
            &[0xff, 0xfe],
        ))
        .unwrap();
        assert_eq!((t.dtype, t.to_f64()), (WireDType::I32, vec![65534.0]));
    }

    #[test]
    fn copies_are_charged_to_the_budget_and_slices_are_not() {
        let plain = encode(&float_tensor(vec![4, 4], &[1.0; 16], WireDType::F32));
        let mut budget = Budget::fixed(32, "a test");
        let t = decode_shared(Bytes::from(plain.clone()), &mut budget).unwrap();
        assert_eq!((budget.used(), t.numel()), (0, 16));
        let fortran = with_header(
            "{'descr': '<f4', 'fortran_order': True, 'shape': (4, 4), }",
            &plain[plain.len() - 64..],
        );
        let e = decode_shared(Bytes::from(fortran), &mut budget).unwrap_err();
        assert!(
            matches!(&e, ReadError::OverBudget(o) if o.would_reach == 64 && o.limit == 32),
            "{e}"
        );
        assert!(
            e.to_string().starts_with(
                "the data (in Fortran order, copied to C order) would expand the file to 64 B"
            ),
            "{e}"
        );
    }

    #[test]
    fn headers_are_padded_to_64_bytes() {
        for shape in [vec![], vec![3], vec![2, 3, 4]] {
            let n: usize = shape.iter().product();
            let t = float_tensor(shape.clone(), &vec![1.5; n], WireDType::BF16);
            let bytes = encode(&t);
            let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + header_len) % 64, 0);
            assert_eq!(bytes.len(), 10 + header_len + 4 * n, "bf16 written as f32");
            let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
            assert!(
                header.starts_with("{'descr': '<f4'") && header.ends_with('\n'),
                "{header}"
            );
        }
    }
}
