//! Telling JSON inputs apart by their shape, without parsing them whole.
//!
//! The top-level keys of an object (a Chrome trace's `traceEvents` may come after
//! megabytes of `deviceProperties`), or the first elements of an array, are found by a byte
//! scanner that skips values by bracket depth (strings aware), so a 1 GB trace costs one pass
//! over its bytes and no allocation beyond the key names.

/// The shape of a JSON document, as far as detection needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonShape {
    /// An object and its top-level keys, in order.
    Object(Vec<String>),
    /// An array whose first element is an object with these keys.
    ArrayOfObjects(Vec<String>),
    /// An array of arrays of numbers, the first one `len` long (`export_memory_timeline`'s
    /// raw events when 4).
    ArrayOfNumberArrays { len: usize },
    /// `[numbers[], arrays[]]`: `export_memory_timeline`'s plot data.
    TimesAndSizes,
    /// Any other array (an empty one included).
    OtherArray,
    /// Not JSON (or not an object or array).
    NotJson,
}

impl JsonShape {
    /// Whether an object has this top-level key.
    pub fn has_key(&self, key: &str) -> bool {
        match self {
            JsonShape::Object(keys) => keys.iter().any(|k| k == key),
            _ => false,
        }
    }
}

/// The shape of `bytes`.
pub fn json_shape(bytes: &[u8]) -> JsonShape {
    let mut s = Scanner { bytes, at: 0 };
    s.ws();
    match s.peek() {
        Some(b'{') => {
            // A truncated object still shows the keys before the cut (a truncated trace
            // must reach the trace reader, which says where it ends).
            let mut keys = Vec::new();
            let _ = s.object_keys(&mut keys);
            JsonShape::Object(keys)
        }
        Some(b'[') => s.array_shape().unwrap_or(JsonShape::NotJson),
        _ => JsonShape::NotJson,
    }
}

struct Scanner<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.peek() == Some(b)).then(|| self.at += 1)
    }

    /// A string at the cursor, decoded (escapes and all).
    fn string(&mut self) -> Option<String> {
        self.ws();
        let start = self.at;
        self.skip_string()?;
        serde_json::from_slice(&self.bytes[start..self.at]).ok()
    }

    fn skip_string(&mut self) -> Option<()> {
        if self.peek() != Some(b'"') {
            return None;
        }
        self.at += 1;
        loop {
            match self.peek()? {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                _ => self.at += 1,
            }
        }
    }

    /// Skips one value of any kind.
    fn skip_value(&mut self) -> Option<()> {
        self.ws();
        match self.peek()? {
            b'"' => self.skip_string(),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.skip_string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.at += 1;
                }
            }
            _ => {
                let start = self.at;
                while self
                    .peek()
                    .is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace())
                {
                    self.at += 1;
                }
                (self.at > start).then_some(())
            }
        }
    }

    /// Collects an object's keys into `keys` (those before a defect, if any).
    fn object_keys(&mut self, keys: &mut Vec<String>) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            keys.push(self.string()?);
            self.eat(b':')?;
            self.skip_value()?;
            if self.eat(b',').is_none() {
                return self.eat(b'}');
            }
        }
    }

    /// Whether the value at the cursor is a number (without moving).
    fn at_number(&mut self) -> bool {
        self.ws();
        self.peek().is_some_and(|b| b == b'-' || b.is_ascii_digit())
    }

    fn array_shape(&mut self) -> Option<JsonShape> {
        self.eat(b'[')?;
        self.ws();
        match self.peek()? {
            b'{' => {
                let mut keys = Vec::new();
                let _ = self.object_keys(&mut keys);
                Some(JsonShape::ArrayOfObjects(keys))
            }
            b'[' => {
                let first = self.at;
                self.at += 1;
                if self.eat(b']').is_some() || !self.at_number() {
                    return Some(JsonShape::OtherArray);
                }
                self.at = first;
                // Count the first inner array's numbers.
                self.eat(b'[')?;
                let mut len = 0;
                loop {
                    if !self.at_number() {
                        return Some(JsonShape::OtherArray);
                    }
                    self.skip_value()?;
                    len += 1;
                    if self.eat(b',').is_none() {
                        self.eat(b']')?;
                        break;
                    }
                }
                // The second element tells raw events (numbers) from plot data (arrays).
                if self.eat(b',').is_none() {
                    return Some(JsonShape::ArrayOfNumberArrays { len });
                }
                self.eat(b'[')?;
                self.ws();
                Some(match self.peek()? {
                    b'[' => JsonShape::TimesAndSizes,
                    _ => JsonShape::ArrayOfNumberArrays { len },
                })
            }
            _ => Some(JsonShape::OtherArray),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_told_apart() {
        assert_eq!(
            json_shape(br#" {"a": {"x": [1, "}"]}, "traceEvents": []} "#),
            JsonShape::Object(vec!["a".into(), "traceEvents".into()])
        );
        assert_eq!(
            json_shape(br#"[{"ph": "X", "name": "a\"b"}]"#),
            JsonShape::ArrayOfObjects(vec!["ph".into(), "name".into()])
        );
        assert_eq!(
            json_shape(b"[[-1, 1, 4096, 0], [5, 2, 512, 3]]"),
            JsonShape::ArrayOfNumberArrays { len: 4 }
        );
        assert_eq!(
            json_shape(b"[[1, 2, 3, 4], [[0,1,2,3,4,5,6,7,8]]]"),
            JsonShape::TimesAndSizes
        );
        assert_eq!(json_shape(b"[]"), JsonShape::OtherArray);
        assert_eq!(json_shape(b"hello"), JsonShape::NotJson);
        assert_eq!(
            json_shape(br#"{"a": [1, 2], "traceEvents": [{"#),
            JsonShape::Object(vec!["a".into(), "traceEvents".into()])
        );
    }
}
