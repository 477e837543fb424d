//! A Python pickle reader for plain data (protocols 0-5), after Python's `Lib/pickle.py`
//! `_Unpickler`.
//!
//! Note [Pickle reader arena]: objects are built in an arena of nodes and the stack, the mark
//! stack and the memo hold node indices, exactly as the Python unpickler holds object
//! references. A container memoised before it is filled (`EMPTY_DICT`, `MEMOIZE`, `MARK`, ...,
//! `SETITEMS`, which is how `pickle.dump` writes every container) is therefore seen complete by a
//! later `BINGET`. The tree is materialised once, at `STOP`, with a nesting limit (which also
//! stops self-referencing containers) and a size budget (which stops a few bytes of `BINGET`s
//! from expanding into gigabytes).

use std::collections::HashMap;

use super::decode::{decimal_int, int_from_le, python_string_literal, raw_unicode_escape};
use super::error::PickleError;
use super::opcodes as op;
use super::value::PickleValue;

/// Deepest container nesting accepted, in levels (Python's own recursion limit is 1000).
pub const MAX_DEPTH: usize = 1000;

/// How much memory the decoded tree may take, per byte of input (see Note [Pickle memory
/// budget]).
pub const MAX_EXPANSION: usize = 64;

/// Memory the decoded tree may take whatever the input's size, in bytes (64 MiB): small
/// pickles of shared references are not refused for their ratio alone.
pub const BUDGET_FLOOR_BYTES: usize = 64 << 20;

/// The memory budget of a decoded tree for an input of `input_bytes` bytes, in bytes:
/// `MAX_EXPANSION × input_bytes + BUDGET_FLOOR_BYTES` (saturating).
///
/// Note [Pickle memory budget]: a pickle shares an object by reference (`BINGET`, two bytes),
/// and the [`PickleValue`] tree gives every reference its own copy, so a few bytes can ask for
/// gigabytes. The budget charges every node built, once per reference, for what it really
/// takes: `size_of::<PickleValue>()` (32 bytes) plus its string, bytes or big-integer payload,
/// plus a dict key's copy in the duplicate-key index. (The old budget charged 16 bytes a node
/// against 256× the input, which let a 20 MB pickle reach 9.7 GB before failing: newcomer
/// defect 5.) The whole tree's cost is computed from the arena first, each shared node once,
/// so an input over budget is refused before any of its tree is built. A real snapshot expands
/// far less than 64×: PyTorch's own snapshot in
/// `tests/data/two_stream_pipeline.snapshot.pickle` takes about 9× its size.
pub fn memory_budget(input_bytes: usize) -> usize {
    input_bytes
        .saturating_mul(MAX_EXPANSION)
        .saturating_add(BUDGET_FLOOR_BYTES)
}

/// Decodes one pickle from `data` into a [`PickleValue`] tree.
///
/// Bytes after the `STOP` opcode are ignored, as `pickle.loads` ignores them.
///
/// # Errors
///
/// - [`PickleError::Truncated`] / [`PickleError::MissingStop`]: the input ends early.
/// - [`PickleError::UnknownOpcode`]: a byte that is no pickle opcode.
/// - [`PickleError::Unsupported`]: an opcode that builds objects other than plain data
///   (`GLOBAL`, `REDUCE`, `BUILD`, sets, out-of-band buffers, persistent ids, ...).
/// - [`PickleError::Malformed`]: an opcode misused (stack underflow, missing `MARK`, `SETITEMS`
///   on a list, unknown memo index, invalid UTF-8, nesting deeper than [`MAX_DEPTH`], output
///   larger than the size budget, ...).
///
/// Every error names the byte offset and the opcode. Nothing in here panics on any input.
///
/// # Examples
///
/// ```
/// use berth_alloc::pickle::{from_slice, PickleValue};
/// // pickle.dumps({"a": [1, None]}, protocol=2)
/// let data = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01]q\x02(K\x01Nes.";
/// let v = from_slice(data)?;
/// assert_eq!(v.get("a"), Some(&PickleValue::List(vec![PickleValue::Int(1), PickleValue::None])));
/// # Ok::<(), berth_alloc::pickle::PickleError>(())
/// ```
pub fn from_slice(data: &[u8]) -> Result<PickleValue, PickleError> {
    Reader::new(data).run()
}

/// One object under construction (see Note [Pickle reader arena]).
enum Node {
    Scalar(PickleValue),
    List(Vec<usize>),
    Tuple(Vec<usize>),
    Dict(Vec<(usize, usize)>),
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset and name of the opcode being executed, for error messages.
    op_offset: usize,
    op_name: &'static str,
    nodes: Vec<Node>,
    stack: Vec<usize>,
    /// Stack lengths at each `MARK` (Python's metastack).
    marks: Vec<usize>,
    memo: HashMap<u64, usize>,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        Reader {
            data,
            pos: 0,
            op_offset: 0,
            op_name: "",
            nodes: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
        }
    }

    fn malformed(&self, reason: impl Into<String>) -> PickleError {
        PickleError::Malformed {
            offset: self.op_offset,
            opcode: self.op_name,
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        match end {
            Some(end) => {
                let s = &self.data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(PickleError::Truncated {
                offset: self.op_offset,
                opcode: self.op_name,
                needed: n - (self.data.len() - self.pos),
                len: self.data.len(),
            }),
        }
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8_arg(&mut self) -> Result<usize, PickleError> {
        Ok(usize::from(self.take_array::<1>()?[0]))
    }

    fn u16_arg(&mut self) -> Result<usize, PickleError> {
        Ok(usize::from(u16::from_le_bytes(self.take_array()?)))
    }

    fn u32_arg(&mut self) -> Result<usize, PickleError> {
        Ok(u32::from_le_bytes(self.take_array()?) as usize)
    }

    fn u64_arg(&mut self) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.take_array()?))
    }

    /// A length argument of 8 bytes, checked against the remaining input before use.
    fn len8_arg(&mut self) -> Result<usize, PickleError> {
        let n = self.u64_arg()?;
        usize::try_from(n).map_err(|_| self.malformed(format!("length {n} does not fit in memory")))
    }

    /// A newline-terminated text argument (protocol 0), without the newline.
    fn line(&mut self) -> Result<&'a [u8], PickleError> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                self.pos += i + 1;
                Ok(&rest[..i])
            }
            None => Err(PickleError::Truncated {
                offset: self.op_offset,
                opcode: self.op_name,
                needed: 1,
                len: self.data.len(),
            }),
        }
    }

    fn utf8(&self, bytes: &[u8]) -> Result<String, PickleError> {
        String::from_utf8(bytes.to_vec()).map_err(|e| {
            self.malformed(format!(
                "string is not valid UTF-8 (error at string byte {})",
                e.utf8_error().valid_up_to()
            ))
        })
    }

    fn push_node(&mut self, node: Node) {
        self.nodes.push(node);
        self.stack.push(self.nodes.len() - 1);
    }

    fn push(&mut self, v: PickleValue) {
        self.push_node(Node::Scalar(v));
    }

    /// Start of the items above the last `MARK` (0 when there is none).
    fn frame_base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<usize, PickleError> {
        if self.stack.len() <= self.frame_base() {
            return Err(self.malformed(
                "needs an object on the stack, but the stack (above the last MARK) is empty",
            ));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.malformed("stack is empty"))
    }

    fn top(&self) -> Result<usize, PickleError> {
        if self.stack.len() <= self.frame_base() {
            return Err(self.malformed(
                "needs an object on the stack, but the stack (above the last MARK) is empty",
            ));
        }
        self.stack
            .last()
            .copied()
            .ok_or_else(|| self.malformed("stack is empty"))
    }

    /// Pops the items pushed since the last `MARK`, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<usize>, PickleError> {
        let base = self
            .marks
            .pop()
            .ok_or_else(|| self.malformed("needs a MARK on the stack, but there is none"))?;
        Ok(self.stack.split_off(base))
    }

    fn memo_put(&mut self, key: u64) -> Result<(), PickleError> {
        let top = self.top()?;
        self.memo.insert(key, top);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Result<(), PickleError> {
        match self.memo.get(&key) {
            Some(&n) => {
                self.stack.push(n);
                Ok(())
            }
            None => Err(self.malformed(format!(
                "memo index {key} was never stored (no PUT/MEMOIZE before it)"
            ))),
        }
    }

    fn unsupported(&self, what: &'static str) -> PickleError {
        PickleError::Unsupported {
            offset: self.op_offset,
            opcode: self.op_name,
            what,
        }
    }

    fn run(mut self) -> Result<PickleValue, PickleError> {
        loop {
            self.op_offset = self.pos;
            let Some(&byte) = self.data.get(self.pos) else {
                return Err(PickleError::MissingStop {
                    offset: self.data.len(),
                });
            };
            self.pos += 1;
            self.op_name = op::name(byte).ok_or(PickleError::UnknownOpcode {
                offset: self.op_offset,
                byte,
            })?;
            if byte == op::STOP {
                let top = self.pop()?;
                return self.materialize(top);
            }
            self.step(byte)?;
        }
    }

    /// Executes one opcode other than `STOP`.
    fn step(&mut self, byte: u8) -> Result<(), PickleError> {
        match byte {
            op::PROTO => {
                let proto = self.u8_arg()?;
                if proto > 5 {
                    return Err(
                        self.malformed(format!("protocol {proto} is unknown; expected 0 to 5"))
                    );
                }
            }
            op::FRAME => {
                // Frames only group opcodes for buffered reads; check the length is there.
                let n = self.len8_arg()?;
                if n > self.data.len() - self.pos {
                    return Err(PickleError::Truncated {
                        offset: self.op_offset,
                        opcode: self.op_name,
                        needed: n - (self.data.len() - self.pos),
                        len: self.data.len(),
                    });
                }
            }
            op::MARK => self.marks.push(self.stack.len()),
            op::POP => {
                if self.stack.len() > self.frame_base() {
                    self.stack.pop();
                } else {
                    self.pop_mark()?;
                }
            }
            op::POP_MARK => {
                self.pop_mark()?;
            }
            op::DUP => {
                let t = self.top()?;
                self.stack.push(t);
            }
            op::NONE => self.push(PickleValue::None),
            op::NEWTRUE => self.push(PickleValue::Bool(true)),
            op::NEWFALSE => self.push(PickleValue::Bool(false)),
            op::BININT => {
                let v = i32::from_le_bytes(self.take_array()?);
                self.push(PickleValue::Int(i64::from(v)));
            }
            op::BININT1 => {
                let v = self.u8_arg()?;
                self.push(PickleValue::Int(v as i64));
            }
            op::BININT2 => {
                let v = self.u16_arg()?;
                self.push(PickleValue::Int(v as i64));
            }
            op::LONG1 => {
                let n = self.u8_arg()?;
                let bytes = self.take(n)?;
                self.push(int_from_le(bytes));
            }
            op::LONG4 => {
                let n = i32::from_le_bytes(self.take_array()?);
                let n = usize::try_from(n)
                    .map_err(|_| self.malformed(format!("negative length {n}")))?;
                let bytes = self.take(n)?;
                self.push(int_from_le(bytes));
            }
            op::INT => {
                let line = self.line()?;
                let v = match line {
                    b"01" => PickleValue::Bool(true),
                    b"00" => PickleValue::Bool(false),
                    _ => self.decimal(line)?,
                };
                self.push(v);
            }
            op::LONG => {
                let line = self.line()?;
                let line = line.strip_suffix(b"L").unwrap_or(line);
                let v = self.decimal(line)?;
                self.push(v);
            }
            op::BINFLOAT => {
                let v = f64::from_be_bytes(self.take_array()?);
                self.push(PickleValue::Float(v));
            }
            op::FLOAT => {
                let line = self.line()?;
                let v = std::str::from_utf8(line)
                    .ok()
                    .and_then(|s| s.trim().parse::<f64>().ok())
                    .ok_or_else(|| {
                        self.malformed(format!(
                            "{:?} is not a decimal float",
                            String::from_utf8_lossy(line)
                        ))
                    })?;
                self.push(PickleValue::Float(v));
            }
            op::BINUNICODE => {
                let n = self.u32_arg()?;
                let s = self.take(n)?;
                let s = self.utf8(s)?;
                self.push(PickleValue::Str(s));
            }
            op::SHORT_BINUNICODE => {
                let n = self.u8_arg()?;
                let s = self.take(n)?;
                let s = self.utf8(s)?;
                self.push(PickleValue::Str(s));
            }
            op::BINUNICODE8 => {
                let n = self.len8_arg()?;
                let s = self.take(n)?;
                let s = self.utf8(s)?;
                self.push(PickleValue::Str(s));
            }
            op::UNICODE => {
                let line = self.line()?;
                let s = raw_unicode_escape(line)
                    .ok_or_else(|| self.malformed("bad raw-unicode-escape sequence"))?;
                self.push(PickleValue::Str(s));
            }
            op::BINSTRING | op::SHORT_BINSTRING => {
                let n = if byte == op::BINSTRING {
                    let n = i32::from_le_bytes(self.take_array()?);
                    usize::try_from(n)
                        .map_err(|_| self.malformed(format!("negative length {n}")))?
                } else {
                    self.u8_arg()?
                };
                // Python 2 `str`: decoded as Latin-1, which maps every byte.
                let s = self.take(n)?.iter().map(|&b| char::from(b)).collect();
                self.push(PickleValue::Str(s));
            }
            op::STRING => {
                let line = self.line()?;
                let s = python_string_literal(line)
                    .ok_or_else(|| self.malformed("expected a quoted string literal"))?;
                self.push(PickleValue::Str(s));
            }
            op::BINBYTES => {
                let n = self.u32_arg()?;
                let b = self.take(n)?.to_vec();
                self.push(PickleValue::Bytes(b));
            }
            op::SHORT_BINBYTES => {
                let n = self.u8_arg()?;
                let b = self.take(n)?.to_vec();
                self.push(PickleValue::Bytes(b));
            }
            op::BINBYTES8 | op::BYTEARRAY8 => {
                let n = self.len8_arg()?;
                let b = self.take(n)?.to_vec();
                self.push(PickleValue::Bytes(b));
            }
            op::EMPTY_DICT => self.push_node(Node::Dict(Vec::new())),
            op::EMPTY_LIST => self.push_node(Node::List(Vec::new())),
            op::EMPTY_TUPLE => self.push_node(Node::Tuple(Vec::new())),
            op::DICT => {
                let items = self.pop_mark()?;
                if items.len() % 2 != 0 {
                    return Err(self.malformed(format!(
                        "needs key/value pairs after MARK, found {} items",
                        items.len()
                    )));
                }
                let pairs = items.chunks_exact(2).map(|c| (c[0], c[1])).collect();
                self.push_node(Node::Dict(pairs));
            }
            op::LIST => {
                let items = self.pop_mark()?;
                self.push_node(Node::List(items));
            }
            op::TUPLE => {
                let items = self.pop_mark()?;
                self.push_node(Node::Tuple(items));
            }
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                let n = usize::from(byte - op::TUPLE1 + 1);
                if self.stack.len() < self.frame_base() + n {
                    return Err(self.malformed(format!(
                        "needs {n} objects on the stack (above the last MARK)"
                    )));
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.push_node(Node::Tuple(items));
            }
            op::SETITEM => {
                let v = self.pop()?;
                let k = self.pop()?;
                let d = self.top()?;
                self.dict_mut(d)?.push((k, v));
            }
            op::SETITEMS => {
                let items = self.pop_mark()?;
                if items.len() % 2 != 0 {
                    return Err(self.malformed(format!(
                        "needs key/value pairs after MARK, found {} items",
                        items.len()
                    )));
                }
                let d = self.top()?;
                self.dict_mut(d)?
                    .extend(items.chunks_exact(2).map(|c| (c[0], c[1])));
            }
            op::APPEND => {
                let v = self.pop()?;
                let l = self.top()?;
                self.list_mut(l)?.push(v);
            }
            op::APPENDS => {
                let items = self.pop_mark()?;
                let l = self.top()?;
                self.list_mut(l)?.extend(items);
            }
            op::MEMOIZE => {
                let key = self.memo.len() as u64;
                self.memo_put(key)?;
            }
            op::BINPUT => {
                let key = self.u8_arg()? as u64;
                self.memo_put(key)?;
            }
            op::LONG_BINPUT => {
                let key = self.u32_arg()? as u64;
                self.memo_put(key)?;
            }
            op::PUT => {
                let key = self.text_index()?;
                self.memo_put(key)?;
            }
            op::BINGET => {
                let key = self.u8_arg()? as u64;
                self.memo_get(key)?;
            }
            op::LONG_BINGET => {
                let key = self.u32_arg()? as u64;
                self.memo_get(key)?;
            }
            op::GET => {
                let key = self.text_index()?;
                self.memo_get(key)?;
            }
            op::EMPTY_SET | op::ADDITEMS | op::FROZENSET => return Err(self.unsupported("a set")),
            op::GLOBAL
            | op::STACK_GLOBAL
            | op::INST
            | op::OBJ
            | op::NEWOBJ
            | op::NEWOBJ_EX
            | op::REDUCE
            | op::BUILD => return Err(self.unsupported("a class instance or calls a function")),
            op::EXT1 | op::EXT2 | op::EXT4 => {
                return Err(self.unsupported("an object from the extension registry"))
            }
            op::PERSID | op::BINPERSID => return Err(self.unsupported("a persistent-id reference")),
            op::NEXT_BUFFER | op::READONLY_BUFFER => {
                return Err(self.unsupported("an out-of-band buffer"))
            }
            _ => {
                return Err(PickleError::UnknownOpcode {
                    offset: self.op_offset,
                    byte,
                })
            }
        }
        Ok(())
    }

    fn text_index(&mut self) -> Result<u64, PickleError> {
        let line = self.line()?;
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| {
                self.malformed(format!(
                    "{:?} is not a memo index",
                    String::from_utf8_lossy(line)
                ))
            })
    }

    fn decimal(&self, line: &[u8]) -> Result<PickleValue, PickleError> {
        decimal_int(line).ok_or_else(|| {
            self.malformed(format!(
                "{:?} is not a decimal integer",
                String::from_utf8_lossy(line)
            ))
        })
    }

    fn dict_mut(&mut self, idx: usize) -> Result<&mut Vec<(usize, usize)>, PickleError> {
        let found = node_type(&self.nodes[idx]);
        match &mut self.nodes[idx] {
            Node::Dict(d) => Ok(d),
            _ => Err(PickleError::Malformed {
                offset: self.op_offset,
                opcode: self.op_name,
                reason: format!("sets items on a {found}; expected a dict"),
            }),
        }
    }

    fn list_mut(&mut self, idx: usize) -> Result<&mut Vec<usize>, PickleError> {
        let found = node_type(&self.nodes[idx]);
        match &mut self.nodes[idx] {
            Node::List(l) => Ok(l),
            _ => Err(PickleError::Malformed {
                offset: self.op_offset,
                opcode: self.op_name,
                reason: format!("appends to a {found}; expected a list"),
            }),
        }
    }

    /// Builds the tree rooted at `root` (see Note [Pickle reader arena]).
    fn materialize(&self, root: usize) -> Result<PickleValue, PickleError> {
        // The whole tree's cost is known before any of it is built, so an input over budget
        // fails having allocated nothing of its tree (Note [Pickle memory budget]).
        let limit = memory_budget(self.data.len());
        let mut memo = vec![None; self.nodes.len()];
        let total = self.cost(root, 0, &mut memo)?;
        let mut budget = limit;
        self.charge(&mut budget, total)?;
        let mut budget = limit;
        self.build(root, 0, &mut budget)
    }

    /// What building the tree at `idx` charges (as [`build`](Self::build) charges it),
    /// saturating; each node's cost computed once. `memo[i]` is `Some(usize::MAX)` while node
    /// `i` is being costed, so a container that contains itself is refused here.
    fn cost(
        &self,
        idx: usize,
        depth: usize,
        memo: &mut Vec<Option<usize>>,
    ) -> Result<usize, PickleError> {
        const IN_PROGRESS: usize = usize::MAX;
        let too_deep = || {
            self.malformed(format!(
                "the object nests deeper than {MAX_DEPTH} levels or contains itself; expected plain nested data"
            ))
        };
        if depth >= MAX_DEPTH {
            return Err(too_deep());
        }
        match memo.get(idx).copied().flatten() {
            Some(IN_PROGRESS) => return Err(too_deep()),
            Some(c) => return Ok(c),
            None => {}
        }
        if let Some(slot) = memo.get_mut(idx) {
            *slot = Some(IN_PROGRESS);
        }
        let node = &self.nodes[idx];
        let mut total = std::mem::size_of::<PickleValue>();
        match node {
            Node::Scalar(PickleValue::Str(s)) => total = total.saturating_add(s.len()),
            Node::Scalar(PickleValue::Bytes(b) | PickleValue::BigInt(b)) => {
                total = total.saturating_add(b.len());
            }
            Node::Scalar(_) => {}
            Node::List(items) | Node::Tuple(items) => {
                for &i in items {
                    total = total.saturating_add(self.cost(i, depth + 1, memo)?);
                }
            }
            Node::Dict(pairs) => {
                for &(k, v) in pairs {
                    total = total.saturating_add(self.cost(k, depth + 1, memo)?);
                    if let Node::Scalar(PickleValue::Str(s)) = &self.nodes[k] {
                        total = total.saturating_add(s.len() + std::mem::size_of::<KeyRepr>());
                    }
                    total = total.saturating_add(self.cost(v, depth + 1, memo)?);
                }
            }
        }
        // Kept below the in-progress marker.
        let total = total.min(IN_PROGRESS - 1);
        if let Some(slot) = memo.get_mut(idx) {
            *slot = Some(total);
        }
        Ok(total)
    }

    /// Charges `cost` bytes to `budget` (Note [Pickle memory budget]).
    fn charge(&self, budget: &mut usize, cost: usize) -> Result<(), PickleError> {
        *budget = budget.checked_sub(cost).ok_or_else(|| {
            let limit = memory_budget(self.data.len());
            self.malformed(format!(
                "shared references expand to more than {limit} bytes of objects for {} bytes of input; expected at most {MAX_EXPANSION}× the input size plus {BUDGET_FLOOR_BYTES} bytes (a pickle of plain data, as _dump_snapshot writes)",
                self.data.len()
            ))
        })?;
        Ok(())
    }

    fn build(
        &self,
        idx: usize,
        depth: usize,
        budget: &mut usize,
    ) -> Result<PickleValue, PickleError> {
        if depth >= MAX_DEPTH {
            return Err(self.malformed(format!(
                "the object nests deeper than {MAX_DEPTH} levels or contains itself; expected plain nested data"
            )));
        }
        let node = &self.nodes[idx];
        let cost = std::mem::size_of::<PickleValue>()
            + match node {
                Node::Scalar(PickleValue::Str(s)) => s.len(),
                Node::Scalar(PickleValue::Bytes(b) | PickleValue::BigInt(b)) => b.len(),
                _ => 0,
            };
        self.charge(budget, cost)?;
        Ok(match node {
            Node::Scalar(v) => v.clone(),
            Node::List(items) => PickleValue::List(self.build_all(items, depth, budget)?),
            Node::Tuple(items) => PickleValue::Tuple(self.build_all(items, depth, budget)?),
            Node::Dict(pairs) => {
                // A key set twice keeps its first position and its last value, as in Python.
                let mut out: Vec<(PickleValue, PickleValue)> = Vec::with_capacity(pairs.len());
                let mut seen: HashMap<KeyRepr, usize> = HashMap::new();
                for &(k, v) in pairs {
                    let k = self.build(k, depth + 1, budget)?;
                    // The key's copy in `seen`.
                    if let PickleValue::Str(s) = &k {
                        self.charge(budget, s.len() + std::mem::size_of::<KeyRepr>())?;
                    }
                    let v = self.build(v, depth + 1, budget)?;
                    match KeyRepr::of(&k).and_then(|r| seen.get(&r).copied().map(|i| (r, i))) {
                        Some((_, i)) => out[i].1 = v,
                        None => {
                            if let Some(r) = KeyRepr::of(&k) {
                                seen.insert(r, out.len());
                            }
                            out.push((k, v));
                        }
                    }
                }
                PickleValue::Dict(out)
            }
        })
    }

    fn build_all(
        &self,
        items: &[usize],
        depth: usize,
        budget: &mut usize,
    ) -> Result<Vec<PickleValue>, PickleError> {
        items
            .iter()
            .map(|&i| self.build(i, depth + 1, budget))
            .collect()
    }
}

/// The hashable key kinds whose duplicates are merged (str and int keys, which is all
/// `_dump_snapshot` writes).
#[derive(PartialEq, Eq, Hash)]
enum KeyRepr {
    Str(String),
    Int(i64),
}

impl KeyRepr {
    fn of(v: &PickleValue) -> Option<KeyRepr> {
        match v {
            PickleValue::Str(s) => Some(KeyRepr::Str(s.clone())),
            PickleValue::Int(i) => Some(KeyRepr::Int(*i)),
            _ => None,
        }
    }
}

fn node_type(n: &Node) -> &'static str {
    match n {
        Node::Scalar(v) => v.type_name(),
        Node::List(_) => "list",
        Node::Tuple(_) => "tuple",
        Node::Dict(_) => "dict",
    }
}
