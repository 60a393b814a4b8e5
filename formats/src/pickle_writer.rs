//! A writer of Python pickles, for the files tenplan writes in PyTorch's
//! formats: DCP's `.metadata` and `torch.save`'s `data.pkl`. It emits the
//! opcodes of protocol 2 (and `BINBYTES` of protocol 3 where bytes are
//! written); the caller writes a value as Python would pickle it, opcode
//! by opcode, with no memo (Python's unpickler needs none).

use crate::pickle::{Built, Value};

/// An opcode stream being written.
#[derive(Clone, Debug)]
pub struct PickleWriter {
    out: Vec<u8>,
}

impl PickleWriter {
    /// A pickle of the given protocol (2 or 3).
    pub fn new(protocol: u8) -> PickleWriter {
        PickleWriter {
            out: vec![0x80, protocol],
        }
    }

    /// `None`.
    pub fn none(&mut self) -> &mut Self {
        self.out.push(b'N');
        self
    }

    /// A bool.
    pub fn bool(&mut self, b: bool) -> &mut Self {
        self.out.push(if b { 0x88 } else { 0x89 });
        self
    }

    /// An integer.
    pub fn int(&mut self, i: i64) -> &mut Self {
        if (0..256).contains(&i) {
            self.out.extend([b'K', i as u8]);
        } else if (0..65536).contains(&i) {
            self.out.push(b'M');
            self.out.extend((i as u16).to_le_bytes());
        } else if let Ok(i) = i32::try_from(i) {
            self.out.push(b'J');
            self.out.extend(i.to_le_bytes());
        } else {
            // LONG1: little-endian two's complement, 8 bytes.
            self.out.extend([0x8a, 8]);
            self.out.extend(i.to_le_bytes());
        }
        self
    }

    /// A float (`BINFLOAT`, big-endian).
    pub fn float(&mut self, x: f64) -> &mut Self {
        self.out.push(b'G');
        self.out.extend(x.to_be_bytes());
        self
    }

    /// A string.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.out.push(b'X');
        self.out.extend((s.len() as u32).to_le_bytes());
        self.out.extend(s.as_bytes());
        self
    }

    /// Bytes (`BINBYTES`, protocol 3).
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.out.push(b'B');
        self.out.extend((b.len() as u32).to_le_bytes());
        self.out.extend(b);
        self
    }

    /// A global, `module.name`.
    pub fn global(&mut self, module: &str, name: &str) -> &mut Self {
        self.out.push(b'c');
        self.out.extend(module.as_bytes());
        self.out.push(b'\n');
        self.out.extend(name.as_bytes());
        self.out.push(b'\n');
        self
    }

    /// The start of a tuple's, a list's or a dict's items.
    pub fn mark(&mut self) -> &mut Self {
        self.out.push(b'(');
        self
    }

    /// A tuple of everything since the last mark.
    pub fn tuple(&mut self) -> &mut Self {
        self.out.push(b't');
        self
    }

    /// A tuple of `ints`.
    pub fn int_tuple(&mut self, ints: &[u64]) -> &mut Self {
        self.mark();
        for &i in ints {
            self.int(i as i64);
        }
        self.tuple()
    }

    /// An empty dict; fill it with [`PickleWriter::mark`], keys and values,
    /// then [`PickleWriter::set_items`].
    pub fn empty_dict(&mut self) -> &mut Self {
        self.out.push(b'}');
        self
    }

    /// Add the key-value pairs since the last mark to the dict below it.
    pub fn set_items(&mut self) -> &mut Self {
        self.out.push(b'u');
        self
    }

    /// An empty list; fill it with a mark, the items, then
    /// [`PickleWriter::appends`].
    pub fn empty_list(&mut self) -> &mut Self {
        self.out.push(b']');
        self
    }

    /// Append the items since the last mark to the list below it.
    pub fn appends(&mut self) -> &mut Self {
        self.out.push(b'e');
        self
    }

    /// Call the callable below the argument tuple on top (`REDUCE`).
    pub fn reduce(&mut self) -> &mut Self {
        self.out.push(b'R');
        self
    }

    /// `cls.__new__(cls, *args)` of the class below the argument tuple on
    /// top (`NEWOBJ`): how Python pickles instances of plain classes.
    pub fn newobj(&mut self) -> &mut Self {
        self.out.push(0x81);
        self
    }

    /// Set the state (a dict) on top into the object below it (`BUILD`).
    pub fn build(&mut self) -> &mut Self {
        self.out.push(b'b');
        self
    }

    /// A persistent id: the value on top (`BINPERSID`).
    pub fn persistent(&mut self) -> &mut Self {
        self.out.push(b'Q');
        self
    }

    /// An instance of `module.class` as Python pickles a dataclass: created
    /// without arguments, then its fields set from a dict, each written by
    /// `field` (keys in the order given).
    pub fn instance(
        &mut self,
        module: &str,
        class: &str,
        fields: &[&str],
        mut field: impl FnMut(&mut Self, &str),
    ) -> &mut Self {
        self.global(module, class);
        self.out.push(b')'); // EMPTY_TUPLE
        self.newobj();
        self.empty_dict();
        self.mark();
        for f in fields {
            self.str(f);
            field(self, f);
        }
        self.set_items();
        self.build()
    }

    /// A value read by [`crate::pickle::load`], written back: plain values,
    /// containers and globals as they were; an object as the same call of
    /// its class on its arguments (`REDUCE`, `NEWOBJ` or `NEWOBJ_EX`), with
    /// its state set. Shared values are written once per reference (no
    /// memo): the caller makes sure the graph has no cycle
    /// ([`crate::pickle::Value::is_tree`]).
    pub fn value(&mut self, v: &Value) -> &mut Self {
        match v {
            Value::None => self.none(),
            Value::Bool(b) => self.bool(*b),
            Value::Int(i) => self.int(*i),
            Value::Float(x) => self.float(*x),
            Value::Str(s) => self.str(s),
            Value::Bytes(b) => self.bytes(b),
            Value::Tuple(t) => {
                self.mark();
                for x in t.iter() {
                    self.value(x);
                }
                self.tuple()
            }
            Value::List(l) => {
                self.empty_list();
                self.mark();
                for x in l.borrow().iter() {
                    self.value(x);
                }
                self.appends()
            }
            Value::Dict(d) => {
                self.empty_dict();
                self.mark();
                for (k, x) in d.borrow().iter() {
                    self.value(k);
                    self.value(x);
                }
                self.set_items()
            }
            Value::Global(m, n) => self.global(m, n),
            Value::Object(o) => {
                self.value(&o.class);
                self.mark();
                for a in o.args.iter() {
                    self.value(a);
                }
                self.tuple();
                match &o.built {
                    Built::Reduce => {
                        self.reduce();
                    }
                    Built::NewObj => {
                        self.newobj();
                    }
                    Built::NewObjEx(kwargs) => {
                        self.value(kwargs);
                        self.out.push(0x92);
                    }
                }
                if let Some(state) = o.state.borrow().as_ref() {
                    self.value(state);
                    self.build();
                }
                self
            }
            Value::Persistent(p) => {
                self.value(p);
                self.persistent()
            }
        }
    }

    /// The pickle, ended (`STOP`).
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(b'.');
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pickle::load;

    #[test]
    fn what_is_written_reads_back() {
        let mut w = PickleWriter::new(3);
        w.empty_dict().mark();
        w.str("ints").mark();
        for i in [0i64, 255, 256, 65535, 65536, -1, i64::from(i32::MAX) + 1, i64::MIN] {
            w.int(i);
        }
        w.tuple();
        w.str("f").float(-2.5);
        w.str("b").bytes(b"\x00\x01");
        w.str("t").bool(true);
        w.str("n").none();
        w.str("g").global("torch", "float32");
        w.str("l").empty_list().mark().str("x").appends();
        w.set_items();
        let v = load(&w.finish()).unwrap();
        let ints: Vec<i64> = v
            .get("ints")
            .unwrap()
            .items()
            .unwrap()
            .iter()
            .map(|x| x.as_int().unwrap())
            .collect();
        assert_eq!(ints, [0, 255, 256, 65535, 65536, -1, i64::from(i32::MAX) + 1, i64::MIN]);
        assert!(matches!(v.get("f"), Some(Value::Float(x)) if x == -2.5));
        let b = v.get("b").unwrap();
        assert!(matches!(&b, Value::Bytes(b) if &**b == b"\x00\x01"));
        assert_eq!(v.get("g").unwrap().global().as_deref(), Some("torch.float32"));
        assert_eq!(v.get("l").unwrap().items().unwrap()[0].as_str(), Some("x"));
        // A value read back writes the same value.
        let mut again = PickleWriter::new(3);
        again.value(&v);
        let v2 = load(&again.finish()).unwrap();
        assert_eq!(format!("{:?}", v2.get("g")), format!("{:?}", v.get("g")));
    }

    #[test]
    fn dataclass_instances_carry_their_fields() {
        let mut w = PickleWriter::new(2);
        w.instance("m", "Point", &["x", "y"], |w, f| {
            w.int(if f == "x" { 1 } else { 2 });
        });
        let v = load(&w.finish()).unwrap();
        let o = v.as_object().unwrap();
        assert_eq!(o.class_name().as_deref(), Some("m.Point"));
        assert_eq!(o.field("y").unwrap().as_int(), Some(2));
    }
}
