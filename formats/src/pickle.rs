//! A bounded reader of Python pickles (protocols 2 to 5), for the metadata
//! PyTorch writes: DCP's `.metadata` and `torch.save`'s `data.pkl`.
//!
//! Nothing is imported or called: a global is kept as its module and name,
//! and `REDUCE`, `NEWOBJ` and `BUILD` build an [`Object`] recording the
//! callable, its arguments and its state, which the caller interprets.
//! Containers are shared (`Rc<RefCell<..>>`) because pickles memoize a list
//! or dict before filling it. Every opcode consumes input, so the values
//! built are bounded by the input's length; a malformed pickle is an error,
//! never a panic.

use std::cell::RefCell;
use std::rc::Rc;

/// A value of an unpickled object graph.
#[derive(Clone)]
pub enum Value {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An integer that fits 64 bits.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(Rc<str>),
    /// Bytes.
    Bytes(Rc<[u8]>),
    /// A tuple.
    Tuple(Rc<[Value]>),
    /// A list (or a set).
    List(Rc<RefCell<Vec<Value>>>),
    /// A dict, in insertion order.
    Dict(Rc<RefCell<Vec<(Value, Value)>>>),
    /// A global (`module.name`), not resolved.
    Global(Rc<str>, Rc<str>),
    /// What a call of a global built: `REDUCE`, `NEWOBJ` and `BUILD`.
    Object(Rc<Object>),
    /// A persistent id (`torch.save`'s storages).
    Persistent(Rc<Value>),
}

/// A constructed object: its class (or callable), the arguments it was
/// called with, how, and the state `BUILD` gave it.
pub struct Object {
    /// The class or callable.
    pub class: Value,
    /// The arguments.
    pub args: Rc<[Value]>,
    /// How the pickle built it.
    pub built: Built,
    /// The state, when built.
    pub state: RefCell<Option<Value>>,
}

/// How a pickle built an object: which call, so that it can be written
/// back as the same call.
#[derive(Clone, Debug)]
pub enum Built {
    /// `REDUCE`: the callable called on the arguments.
    Reduce,
    /// `NEWOBJ`: `cls.__new__(cls, *args)`.
    NewObj,
    /// `NEWOBJ_EX`: `cls.__new__(cls, *args, **kwargs)`, with the kwargs.
    NewObjEx(Value),
}

impl Value {
    /// Whether the graph below this value is a tree of at most `depth`
    /// levels (shared values allowed, no container or object inside
    /// itself): what [`crate::pickle_writer::PickleWriter::value`] can
    /// write back.
    pub fn is_tree(&self, depth: usize) -> bool {
        fn walk(v: &Value, depth: usize, path: &mut Vec<*const ()>) -> bool {
            let (at, children): (*const (), Vec<Value>) = match v {
                Value::Tuple(t) => (Rc::as_ptr(t) as *const (), t.to_vec()),
                Value::List(l) => (Rc::as_ptr(l) as *const (), l.borrow().clone()),
                Value::Dict(d) => (
                    Rc::as_ptr(d) as *const (),
                    d.borrow().iter().flat_map(|(k, x)| [k.clone(), x.clone()]).collect(),
                ),
                Value::Object(o) => {
                    let mut c = vec![o.class.clone()];
                    c.extend(o.args.iter().cloned());
                    if let Built::NewObjEx(kw) = &o.built {
                        c.push(kw.clone());
                    }
                    c.extend(o.state.borrow().iter().cloned());
                    (Rc::as_ptr(o) as *const (), c)
                }
                Value::Persistent(p) => (Rc::as_ptr(p) as *const (), vec![(**p).clone()]),
                _ => return true,
            };
            if depth == 0 || path.contains(&at) {
                return false;
            }
            path.push(at);
            let ok = children.iter().all(|c| walk(c, depth - 1, path));
            path.pop();
            ok
        }
        walk(self, depth, &mut Vec::new())
    }

    /// What kind of value this is, without its contents (pickles can make
    /// deep or cyclic graphs, which are never printed).
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Bytes(_) => "bytes",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Dict(_) => "a dict",
            Value::Global(..) => "a global",
            Value::Object(_) => "an object",
            Value::Persistent(_) => "a persistent id",
        }
    }

    /// Move this value's children into `out` when nothing else shares them,
    /// so that dropping a deep graph takes a loop, not a recursion as deep
    /// as the graph.
    fn take_children(&mut self, out: &mut Vec<Value>) {
        match self {
            Value::Tuple(t) => {
                if let Some(items) = Rc::get_mut(t) {
                    out.extend(items.iter_mut().map(|x| std::mem::replace(x, Value::None)));
                }
            }
            Value::List(l) if Rc::strong_count(l) == 1 => out.append(&mut l.borrow_mut()),
            Value::Dict(d) if Rc::strong_count(d) == 1 => {
                for (k, v) in d.borrow_mut().drain(..) {
                    out.push(k);
                    out.push(v);
                }
            }
            Value::Object(o) => {
                if let Some(o) = Rc::get_mut(o) {
                    out.push(std::mem::replace(&mut o.class, Value::None));
                    if let Some(args) = Rc::get_mut(&mut o.args) {
                        out.extend(args.iter_mut().map(|x| std::mem::replace(x, Value::None)));
                    }
                    out.extend(o.state.get_mut().take());
                }
            }
            Value::Persistent(p) => {
                if let Some(p) = Rc::get_mut(p) {
                    out.push(std::mem::replace(p, Value::None));
                }
            }
            _ => {}
        }
    }

    /// The global's `module.name`, when this is a global.
    pub fn global(&self) -> Option<String> {
        match self {
            Value::Global(m, n) => Some(format!("{m}.{n}")),
            _ => None,
        }
    }

    /// The string, when this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, when this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// The object, when this is one.
    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    /// The items of a tuple or a list.
    pub fn items(&self) -> Option<Vec<Value>> {
        match self {
            Value::Tuple(t) => Some(t.to_vec()),
            Value::List(l) => Some(l.borrow().clone()),
            _ => None,
        }
    }

    /// The entry of a dict whose key is the string `key`.
    pub fn get(&self, key: &str) -> Option<Value> {
        match self {
            Value::Dict(d) => d
                .borrow()
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v.clone()),
            _ => None,
        }
    }

    /// The entries of a dict.
    pub fn entries(&self) -> Option<Vec<(Value, Value)>> {
        match self {
            Value::Dict(d) => Some(d.borrow().clone()),
            _ => None,
        }
    }
}

impl Drop for Value {
    fn drop(&mut self) {
        let mut pending = Vec::new();
        self.take_children(&mut pending);
        while let Some(mut v) = pending.pop() {
            v.take_children(&mut pending);
        }
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Global(m, n) => write!(f, "{m}.{n}"),
            other => f.write_str(other.kind()),
        }
    }
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "object of {:?}", self.class)
    }
}

impl Object {
    /// The class's `module.name`, when the class is a global.
    pub fn class_name(&self) -> Option<String> {
        self.class.global()
    }

    /// A field of the object's state: a dict entry, or a slot (the second
    /// element of a `(dict, slots)` state).
    pub fn field(&self, name: &str) -> Option<Value> {
        let state = self.state.borrow();
        match state.as_ref()? {
            d @ Value::Dict(_) => d.get(name),
            Value::Tuple(t) if t.len() == 2 => t[0].get(name).or_else(|| t[1].get(name)),
            _ => None,
        }
    }
}

/// Why a pickle could not be read.
pub type PickleError = String;

const MAX_DEPTH: usize = 1 << 16;

/// Unpickle `data`: the value `STOP` returns.
pub fn load(data: &[u8]) -> Result<Value, PickleError> {
    let mut m = Machine {
        data,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
    };
    m.run()
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Vec<Option<Value>>,
}

impl Machine<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(format!("truncated at byte {} (wanted {n} more bytes)", self.pos));
        };
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn uint(&mut self, n: usize) -> Result<u64, PickleError> {
        let b = self.take(n)?;
        let mut x = [0u8; 8];
        x[..n].copy_from_slice(b);
        Ok(u64::from_le_bytes(x))
    }

    fn len(&mut self, n: usize) -> Result<usize, PickleError> {
        let l = self.uint(n)?;
        usize::try_from(l)
            .ok()
            .filter(|&l| l <= self.data.len() - self.pos)
            .ok_or_else(|| format!("length {l} at byte {} runs past the end", self.pos))
    }

    fn line(&mut self) -> Result<String, PickleError> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| format!("unterminated line at byte {}", self.pos))?;
        let s = std::str::from_utf8(&rest[..n]).map_err(|_| format!("a line at byte {} is not UTF-8", self.pos))?;
        self.pos += n + 1;
        Ok(s.to_string())
    }

    fn text(&mut self, n: usize) -> Result<Value, PickleError> {
        let at = self.pos;
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| format!("a string at byte {at} is not UTF-8"))?;
        Ok(Value::Str(s.into()))
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        self.stack
            .pop()
            .ok_or_else(|| format!("stack underflow at byte {}", self.pos))
    }

    fn top(&mut self) -> Result<&mut Value, PickleError> {
        let at = self.pos;
        self.stack
            .last_mut()
            .ok_or_else(|| format!("stack underflow at byte {at}"))
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| format!("no mark at byte {}", self.pos))?;
        if m > self.stack.len() {
            return Err(format!("mark above the stack at byte {}", self.pos));
        }
        Ok(self.stack.split_off(m))
    }

    fn push(&mut self, v: Value) -> Result<(), PickleError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(format!("stack deeper than {MAX_DEPTH} at byte {}", self.pos));
        }
        self.stack.push(v);
        Ok(())
    }

    fn put(&mut self, i: usize) -> Result<(), PickleError> {
        let v = self.top()?.clone();
        if i > self.data.len() {
            return Err(format!("memo index {i} out of range"));
        }
        if self.memo.len() <= i {
            self.memo.resize(i + 1, None);
        }
        self.memo[i] = Some(v);
        Ok(())
    }

    fn get(&mut self, i: usize) -> Result<(), PickleError> {
        let v = self
            .memo
            .get(i)
            .cloned()
            .flatten()
            .ok_or_else(|| format!("memo entry {i} read before it was written"))?;
        self.push(v)
    }

    fn set_items(dict: &Value, items: Vec<Value>) -> Result<(), PickleError> {
        let Value::Dict(d) = dict else {
            return Err("SETITEMS on something that is not a dict".into());
        };
        if !items.len().is_multiple_of(2) {
            return Err("SETITEMS with an odd number of values".into());
        }
        let mut d = d.borrow_mut();
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            d.push((k, v));
        }
        Ok(())
    }

    fn append(list: &Value, items: Vec<Value>) -> Result<(), PickleError> {
        let Value::List(l) = list else {
            return Err("APPEND on something that is not a list".into());
        };
        l.borrow_mut().extend(items);
        Ok(())
    }

    fn object(class: Value, args: Value, built: Built) -> Result<Value, PickleError> {
        let args: Rc<[Value]> = match &args {
            Value::Tuple(t) => t.clone(),
            other => return Err(format!("call arguments are {}, not a tuple", other.kind())),
        };
        Ok(Value::Object(Rc::new(Object {
            class,
            args,
            built,
            state: RefCell::new(None),
        })))
    }

    fn run(&mut self) -> Result<Value, PickleError> {
        loop {
            let at = self.pos;
            let op = self.u8().map_err(|_| "ends without STOP".to_string())?;
            match op {
                0x80 => {
                    let p = self.u8()?;
                    if p > 5 {
                        return Err(format!("protocol {p} (this reader knows 2 to 5)"));
                    }
                }
                0x95 => {
                    self.uint(8)?; // FRAME: a length hint only.
                }
                b'.' => return self.pop(),
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?.clone();
                    self.push(v)?;
                }
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'J' => {
                    let v = self.uint(4)? as u32 as i32 as i64;
                    self.push(Value::Int(v))?
                }
                b'K' => {
                    let v = self.uint(1)? as i64;
                    self.push(Value::Int(v))?
                }
                b'M' => {
                    let v = self.uint(2)? as i64;
                    self.push(Value::Int(v))?
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a { self.u8()? as usize } else { self.len(4)? };
                    let b = self.take(n)?;
                    if n > 8 {
                        return Err(format!("an integer of {n} bytes at byte {at}"));
                    }
                    let mut x = if b.last().is_some_and(|&l| l & 0x80 != 0) {
                        [0xffu8; 8]
                    } else {
                        [0u8; 8]
                    };
                    x[..n].copy_from_slice(b);
                    self.push(Value::Int(i64::from_le_bytes(x)))?
                }
                b'I' => {
                    let l = self.line()?;
                    let v = match l.as_str() {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        s => Value::Int(s.parse().map_err(|_| format!("bad INT {s:?} at byte {at}"))?),
                    };
                    self.push(v)?
                }
                b'G' => {
                    let b = self.take(8)?;
                    let v = f64::from_be_bytes(b.try_into().expect("8 bytes"));
                    self.push(Value::Float(v))?
                }
                0x8c => {
                    let n = self.len(1)?;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                b'X' => {
                    let n = self.len(4)?;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                0x8d => {
                    let n = self.len(8)?;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                b'C' | b'B' | 0x8e | 0x96 | b'U' | b'T' => {
                    let n = match op {
                        b'C' | b'U' => self.len(1)?,
                        b'B' | b'T' => self.len(4)?,
                        _ => self.len(8)?,
                    };
                    let b: Rc<[u8]> = self.take(n)?.into();
                    self.push(Value::Bytes(b))?
                }
                b')' => self.push(Value::Tuple(Rc::from(Vec::new())))?,
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Tuple(items.into()))?
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        return Err(format!("stack underflow at byte {at}"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.push(Value::Tuple(items.into()))?
                }
                b']' => self.push(Value::List(Rc::default()))?,
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Value::List(Rc::new(RefCell::new(items))))?
                }
                b'a' => {
                    let v = self.pop()?;
                    Self::append(self.top()?, vec![v])?
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    Self::append(self.top()?, items)?
                }
                b'}' => self.push(Value::Dict(Rc::default()))?,
                b'd' => {
                    let items = self.pop_mark()?;
                    let d = Value::Dict(Rc::default());
                    Self::set_items(&d, items)?;
                    self.push(d)?
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    Self::set_items(self.top()?, vec![k, v])?
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    Self::set_items(self.top()?, items)?
                }
                0x8f => self.push(Value::List(Rc::default()))?,
                0x90 => {
                    let items = self.pop_mark()?;
                    Self::append(self.top()?, items)?
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.push(Value::List(Rc::new(RefCell::new(items))))?
                }
                b'c' => {
                    let (m, n) = (self.line()?, self.line()?);
                    self.push(Value::Global(m.into(), n.into()))?
                }
                0x93 => {
                    let n = self.pop()?;
                    let m = self.pop()?;
                    match (&m, &n) {
                        (Value::Str(m), Value::Str(n)) => self.push(Value::Global(m.clone(), n.clone()))?,
                        _ => return Err(format!("STACK_GLOBAL of non-strings at byte {at}")),
                    }
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let class = self.pop()?;
                    let built = if op == b'R' { Built::Reduce } else { Built::NewObj };
                    let o = Self::object(class, args, built)?;
                    self.push(o)?
                }
                0x92 => {
                    let kwargs = self.pop()?;
                    let args = self.pop()?;
                    let class = self.pop()?;
                    let o = Self::object(class, args, Built::NewObjEx(kwargs))?;
                    self.push(o)?
                }
                b'b' => {
                    let state = self.pop()?;
                    match self.top()? {
                        Value::Object(o) => *o.state.borrow_mut() = Some(state),
                        other => return Err(format!("BUILD on {} at byte {at}", other.kind())),
                    }
                }
                b'Q' => {
                    let pid = self.pop()?;
                    self.push(Value::Persistent(Rc::new(pid)))?
                }
                b'P' => {
                    let l = self.line()?;
                    self.push(Value::Persistent(Rc::new(Value::Str(l.into()))))?
                }
                b'p' => {
                    let i = self.line()?.parse().map_err(|_| format!("bad PUT at byte {at}"))?;
                    self.put(i)?
                }
                b'q' => {
                    let i = self.uint(1)? as usize;
                    self.put(i)?
                }
                b'r' => {
                    let i = self.uint(4)? as usize;
                    self.put(i)?
                }
                0x94 => {
                    let i = self.memo.len();
                    self.put(i)?
                }
                b'g' => {
                    let i = self.line()?.parse().map_err(|_| format!("bad GET at byte {at}"))?;
                    self.get(i)?
                }
                b'h' => {
                    let i = self.uint(1)? as usize;
                    self.get(i)?
                }
                b'j' => {
                    let i = self.uint(4)? as usize;
                    self.get(i)?
                }
                other => return Err(format!("opcode 0x{other:02x} at byte {at} is not read here")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_dataclass_with_memoized_parts() {
        // pickle.dumps(C(a=1, b=(2, 3), c={"x": -1}), 4) for a dataclass C in
        // module m, then a second reference to the same tuple through the memo.
        let mut p = vec![
            0x80, 4, 0x8c, 1, b'm', 0x94, 0x8c, 1, b'C', 0x94, 0x93, 0x94, b')', 0x81, 0x94,
        ];
        p.extend([b'}', 0x94, b'(']);
        p.extend([0x8c, 1, b'a', 0x94, b'K', 1]);
        p.extend([0x8c, 1, b'b', 0x94, b'K', 2, b'K', 3, 0x86, 0x94]);
        p.extend([
            0x8c, 1, b'c', 0x94, b'}', 0x94, 0x8c, 1, b'x', 0x94, b'J', 0xff, 0xff, 0xff, 0xff, b's',
        ]);
        p.extend([0x8c, 1, b'd', 0x94, b'h', 7]);
        p.extend([b'u', b'b', b'.']);
        let v = load(&p).unwrap();
        let o = v.as_object().unwrap();
        assert_eq!(o.class_name().as_deref(), Some("m.C"));
        assert_eq!(o.field("a").unwrap().as_int(), Some(1));
        let b = o.field("b").unwrap().items().unwrap();
        assert_eq!(b.iter().map(|x| x.as_int().unwrap()).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(o.field("c").unwrap().get("x").unwrap().as_int(), Some(-1));
        let d = o.field("d").unwrap().items().unwrap();
        assert_eq!(d.len(), 2);
        // Built with NEWOBJ, and written back as NEWOBJ.
        assert!(matches!(o.built, Built::NewObj));
        let mut w = crate::pickle_writer::PickleWriter::new(2);
        w.value(&v);
        let again = load(&w.finish()).unwrap();
        assert!(matches!(again.as_object().unwrap().built, Built::NewObj));
        assert!(v.is_tree(8) && !v.is_tree(1));
    }

    #[test]
    fn a_list_inside_itself_is_not_a_tree() {
        // l = []; l.append(l); pickle.dumps(l, 2)
        let p = [0x80, 2, b']', b'q', 0, b'h', 0, b'a', b'.'];
        let v = load(&p).unwrap();
        assert!(!v.is_tree(100));
    }

    #[test]
    fn malformed_pickles_are_errors() {
        for bad in [
            &[][..],
            &[0x80, 9, b'.'],
            &[0x80, 4, b'.'],
            &[b'h', 3, b'.'],
            &[0x8c, 200, b'a'],
            b"u.",
            &[0x8a, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, b'.'],
            &[b'K', 1, b'b', b'.'],
            &[0xff],
        ] {
            assert!(load(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn deep_and_cyclic_graphs_drop_and_print_without_recursing() {
        // A million nested lists, built with a stack of one: each new list
        // is memoized, appended to the one below, and fetched back.
        let n: u32 = 1_000_000;
        let mut p = vec![b']', 0x94];
        for k in 1..=n {
            p.extend([b']', 0x94, b'a', b'0', b'j']);
            p.extend(k.to_le_bytes());
        }
        p.extend([b'0', b'j', 0, 0, 0, 0, b'.']);
        let v = load(&p).unwrap();
        assert_eq!(format!("{v:?}"), "a list");
        drop(v);
        // A list appended to itself through the memo.
        let v = load(&[b']', 0x94, b'h', 0, b'a', b'.']).unwrap();
        assert_eq!(format!("{v:?}"), "a list");
    }

    #[test]
    fn negative_and_long_integers() {
        let v = load(&[0x8a, 2, 0x00, 0xff, b'.']).unwrap();
        assert_eq!(v.as_int(), Some(-256));
        let v = load(&[0x8a, 5, 0, 0, 0, 0, 1, b'.']).unwrap();
        assert_eq!(v.as_int(), Some(1 << 32));
    }
}
