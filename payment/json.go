package payment

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
)

// A body is read in two passes, neither with reflection and, for a typical
// command, with no allocation but the Command and its strings:
//
//   - checkStructure walks every value in the body and rejects, at the first
//     place one occurs, a syntax error, a duplicate key, a top-level name
//     that is not exactly a field, or nesting deeper than
//     maxJSONNestingAllowed;
//   - decodeCommand fills a Command from the first value by encoding/json's
//     rules (null leaves a field alone, the first value of a wrong type
//     decides the error).
//
// They replace a json.Decoder Token walk followed by a json.Decoder decode,
// and keep every result of it, including its accidents: a body may hold
// several values (the walk checks all of them, the decode reads the first
// and then calls the rest trailing data), and a body that stops between two
// tokens passes the walk and fails in the decode. The reason a body gets is
// part of the contract (it names the dead-letter subject), so
// FuzzDecodeMatchesReference holds these passes to that implementation,
// which reference_test.go keeps.

var (
	// errEnd is the body ending between two tokens. The Token walk took that
	// for the end of the input, so it ends the walk without an error.
	errEnd = errors.New("JSON ends between two tokens")
	// errSyntax is any other syntax error, the body ending inside a token
	// included. syntaxErrorText says what it is.
	errSyntax = errors.New("JSON syntax error")
)

// commandFields are Command's fields by their exact JSON names, with the
// reason a value of the wrong JSON type gets.
var commandFields = [...]struct {
	name   string
	reason Reason
}{
	{"merchant_id", ReasonInvalidMerchant},
	{"idempotency_key", ReasonInvalidKey},
	{"amount", ReasonInvalidAmount},
	{"currency", ReasonInvalidCurrency},
	{"payment_method", ReasonInvalidMethod},
	{"description", ReasonInvalidDesc},
	{"metadata", ReasonInvalidMetadata},
	{"kind", ReasonInvalidKind},
	{"payment_key", ReasonInvalidKey},
}

// fieldIndex is the index in commandFields of the field named exactly name,
// or -1.
func fieldIndex(name []byte) int {
	for i, f := range commandFields {
		if string(name) == f.name {
			return i
		}
	}
	return -1
}

// checkStructure walks every JSON value in body. It returns the offset just
// past the first value, or -1 when the body ends before one is complete.
func checkStructure(body []byte) (firstEnd int, err error) {
	s := scanner{data: body}
	firstEnd = -1
	for {
		if _, ok := s.peek(); !ok {
			return firstEnd, nil
		}
		switch err := s.value(0); {
		case err == nil:
		case errors.Is(err, errEnd):
			return firstEnd, nil
		case errors.Is(err, errSyntax):
			return -1, invalid(ReasonMalformedJSON, "", "%s", syntaxErrorText(body))
		default:
			return -1, err
		}
		if firstEnd < 0 {
			firstEnd = s.pos
		}
	}
}

// syntaxErrorText words the first syntax error in body as encoding/json's
// Token walk did, so dead letters keep the text operators know. It runs only
// for a body already found malformed, where speed does not matter, and stops
// at that error, within the nesting limit.
func syntaxErrorText(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		if _, err := dec.Token(); err != nil {
			if errors.Is(err, io.EOF) {
				return "malformed JSON"
			}
			return err.Error()
		}
	}
}

// scanner reads JSON text. Its methods start at s.pos, leave s.pos after
// what they read, and never read past the end of s.data.
type scanner struct {
	data []byte
	pos  int
	// keys[d] is the key of the member being read in the object at depth
	// d+1, or nil in an array: where a value sits, for errors.
	keys [maxJSONNestingAllowed][]byte
}

// peek skips white space and returns the next byte, or false at the end.
func (s *scanner) peek() (byte, bool) {
	for ; s.pos < len(s.data); s.pos++ {
		switch c := s.data[s.pos]; c {
		case ' ', '\t', '\n', '\r':
		default:
			return c, true
		}
	}
	return 0, false
}

// value reads one value, depth containers deep, checking its structure.
func (s *scanner) value(depth int) error {
	c, ok := s.peek()
	if !ok {
		return errEnd
	}
	switch {
	case c == '{' || c == '[':
		if depth >= maxJSONNestingAllowed {
			return invalid(ReasonMalformedJSON, "", "JSON nested deeper than %d levels", maxJSONNestingAllowed)
		}
		if c == '{' {
			return s.object(depth + 1)
		}
		return s.array(depth + 1)
	case c == '"':
		_, _, _, err := s.str()
		return err
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || isDigit(c):
		return s.number()
	}
	return errSyntax
}

// object reads an object at the given depth. At depth 1, the command
// itself, every name must be exactly a field: encoding/json would fold
// "AMOUNT" or "idempotency_\u212aey" (a Kelvin sign) into a field, and one
// body must not mean two commands to two parsers. In every object a key may
// appear once, compared as decoded ("a" and "\u0061" are the same key).
func (s *scanner) object(depth int) error {
	var seenFields uint16 // at depth 1: the fields named so far, by index
	var seenKeys keySet   // deeper: the keys so far
	s.pos++               // the '{'
	c, ok := s.peek()
	if !ok {
		return errEnd
	}
	if c == '}' {
		s.pos++
		return nil
	}
	for {
		if c != '"' {
			return errSyntax
		}
		key, err := s.key()
		if err != nil {
			return err
		}
		s.keys[depth-1] = key
		if depth == 1 {
			i := fieldIndex(key)
			if i < 0 {
				return invalid(ReasonUnknownField, clip(string(key)), "is not a field of a payment command (names are case-sensitive)")
			}
			if seenFields&(1<<i) != 0 {
				return invalid(ReasonDuplicateField, clip(s.path(depth)), "appears more than once")
			}
			seenFields |= 1 << i
		} else if seenKeys.add(key) {
			return invalid(ReasonDuplicateField, clip(s.path(depth)), "appears more than once")
		}
		if c, ok = s.peek(); !ok {
			return errEnd
		}
		if c != ':' {
			return errSyntax
		}
		s.pos++
		if err := s.value(depth); err != nil {
			return err
		}
		if c, ok = s.peek(); !ok {
			return errEnd
		}
		s.pos++
		switch c {
		case '}':
			return nil
		case ',':
		default:
			return errSyntax
		}
		if c, ok = s.peek(); !ok {
			return errEnd
		}
	}
}

// array reads an array at the given depth.
func (s *scanner) array(depth int) error {
	s.pos++ // the '['
	s.keys[depth-1] = nil
	c, ok := s.peek()
	if !ok {
		return errEnd
	}
	if c == ']' {
		s.pos++
		return nil
	}
	for {
		if err := s.value(depth); err != nil {
			return err
		}
		if c, ok = s.peek(); !ok {
			return errEnd
		}
		s.pos++
		switch c {
		case ']':
			return nil
		case ',':
		default:
			return errSyntax
		}
	}
}

// key reads an object key and returns it decoded, as encoding/json decodes
// strings (a lone surrogate becomes U+FFFD). A key without escapes is its own
// bytes, not a copy.
func (s *scanner) key() ([]byte, error) {
	start, end, escaped, err := s.str()
	if err != nil {
		return nil, err
	}
	if !escaped {
		return s.data[start:end], nil
	}
	var k string
	if err := json.Unmarshal(s.data[start-1:end+1], &k); err != nil {
		return nil, errSyntax
	}
	return []byte(k), nil
}

// str reads a string and returns the bounds of what is between its quotes
// and whether that has escapes. Like encoding/json, it accepts any byte but
// control characters (the body is already known to be valid UTF-8).
func (s *scanner) str() (start, end int, escaped bool, err error) {
	s.pos++ // the opening '"'
	start = s.pos
	for s.pos < len(s.data) {
		switch c := s.data[s.pos]; {
		case c == '"':
			s.pos++
			return start, s.pos - 1, escaped, nil
		case c == '\\':
			escaped = true
			if err := s.escape(); err != nil {
				return 0, 0, false, err
			}
		case c < 0x20:
			return 0, 0, false, errSyntax
		default:
			s.pos++
		}
	}
	return 0, 0, false, errSyntax
}

// escape reads one escape sequence in a string.
func (s *scanner) escape() error {
	s.pos++ // the '\\'
	if s.pos >= len(s.data) {
		return errSyntax
	}
	switch s.data[s.pos] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		s.pos++
		return nil
	case 'u':
		s.pos++
		for range 4 {
			if s.pos >= len(s.data) || !isHex(s.data[s.pos]) {
				return errSyntax
			}
			s.pos++
		}
		return nil
	}
	return errSyntax
}

// literal reads the literal word (true, false or null).
func (s *scanner) literal(word string) error {
	for i := range len(word) {
		if s.pos >= len(s.data) || s.data[s.pos] != word[i] {
			return errSyntax
		}
		s.pos++
	}
	return nil
}

// number reads a number as encoding/json's scanner does: greedily, up to the
// first byte that cannot continue it, so "01" is two numbers and "1." is an
// error.
func (s *scanner) number() error {
	s.skip('-')
	if !s.skip('0') && s.digits() == 0 {
		return errSyntax
	}
	if s.skip('.') && s.digits() == 0 {
		return errSyntax
	}
	if s.skip('e') || s.skip('E') {
		if !s.skip('+') {
			s.skip('-')
		}
		if s.digits() == 0 {
			return errSyntax
		}
	}
	return nil
}

// skip reads c if it is the next byte.
func (s *scanner) skip(c byte) bool {
	if s.pos < len(s.data) && s.data[s.pos] == c {
		s.pos++
		return true
	}
	return false
}

// digits reads decimal digits and returns how many.
func (s *scanner) digits() int {
	start := s.pos
	for s.pos < len(s.data) && isDigit(s.data[s.pos]) {
		s.pos++
	}
	return s.pos - start
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// path spells out where the member being read at depth sits, as
// "metadata.k"; an array adds an empty key ("metadata..k"), as it always has.
func (s *scanner) path(depth int) string {
	p := ""
	for _, k := range s.keys[:depth] {
		p = joinPath(p, string(k))
	}
	return p
}

func joinPath(p, k string) string {
	if p == "" {
		return k
	}
	return p + "." + k
}

// keySet holds the keys of one object to find a duplicate: the first few in
// place, all of them in a map once there are more, so that a hostile object
// with thousands of keys costs linear time.
type keySet struct {
	few  [16][]byte
	n    int
	many map[string]struct{}
}

// add adds k and reports whether it was there already.
func (ks *keySet) add(k []byte) (dup bool) {
	if ks.many == nil {
		for _, seen := range ks.few[:ks.n] {
			if bytes.Equal(seen, k) {
				return true
			}
		}
		if ks.n < len(ks.few) {
			ks.few[ks.n] = k
			ks.n++
			return false
		}
		ks.many = make(map[string]struct{}, 2*len(ks.few))
		for _, seen := range ks.few {
			ks.many[string(seen)] = struct{}{}
		}
	}
	if _, dup := ks.many[string(k)]; dup {
		return true
	}
	ks.many[string(k)] = struct{}{}
	return false
}

// decodeCommand fills a Command from data, which holds one value that
// checkStructure passed: valid JSON, a command's exact field names, no
// duplicates. It follows encoding/json: null leaves a field alone (and
// clears the metadata), and the first value of a wrong type, in body order,
// is the error.
func decodeCommand(data []byte) (*Command, error) {
	s := scanner{data: data}
	c := new(Command)
	switch b, _ := s.peek(); b {
	case 'n':
		return c, nil
	case '{':
	default:
		return nil, invalid(ReasonMalformedJSON, "", "wrong JSON type %s", jsonType(b))
	}
	s.pos++
	// One copy of the body for all the strings to share.
	text := string(data)
	if b, _ := s.peek(); b == '}' {
		return c, nil
	}
	for {
		if b, _ := s.peek(); b != '"' {
			return nil, unchecked()
		}
		key, err := s.key()
		i := fieldIndex(key)
		if err != nil || i < 0 || !s.next(':') {
			return nil, unchecked()
		}
		if err := s.field(text, c, i); err != nil {
			return nil, err
		}
		if s.next('}') {
			return c, nil
		}
		if !s.next(',') {
			return nil, unchecked()
		}
	}
}

// unchecked is the error for decodeCommand meeting JSON that checkStructure
// would have rejected: it cannot happen, but it must not panic either.
func unchecked() error {
	return invalid(ReasonMalformedJSON, "", "JSON not checked before decoding")
}

// next skips white space and reads c if it is the next byte.
func (s *scanner) next(c byte) bool {
	s.peek()
	return s.skip(c)
}

// field decodes the value of commandFields[i] into c.
func (s *scanner) field(text string, c *Command, i int) error {
	name := commandFields[i].name
	b, _ := s.peek()
	if b == 'n' {
		if err := s.literal("null"); err != nil {
			return unchecked()
		}
		if name == "metadata" {
			c.Metadata = nil
		}
		return nil
	}
	switch name {
	case "amount":
		if b != '-' && !isDigit(b) {
			return wrongType(i, jsonType(b))
		}
		start := s.pos
		if err := s.number(); err != nil {
			return unchecked()
		}
		n, err := strconv.ParseInt(text[start:s.pos], 10, 64)
		if err != nil {
			return wrongType(i, "number "+text[start:s.pos])
		}
		c.Amount = n
		return nil
	case "metadata":
		if b != '{' {
			return wrongType(i, jsonType(b))
		}
		return s.metadata(text, c, i)
	}
	if b != '"' {
		return wrongType(i, jsonType(b))
	}
	v, err := s.stringValue(text)
	if err != nil {
		return err
	}
	switch name {
	case "merchant_id":
		c.MerchantID = v
	case "idempotency_key":
		c.IdempotencyKey = v
	case "currency":
		c.Currency = v
	case "payment_method":
		c.PaymentMethod = v
	case "description":
		c.Description = v
	case "kind":
		c.Kind = v
	case "payment_key":
		c.PaymentKey = v
	}
	return nil
}

// metadata decodes the metadata object, commandFields[i]. As with
// encoding/json, an empty object is an empty map, not nil, and a null value
// is "".
func (s *scanner) metadata(text string, c *Command, i int) error {
	s.pos++ // the '{'
	c.Metadata = map[string]string{}
	if s.next('}') {
		return nil
	}
	for {
		if b, _ := s.peek(); b != '"' {
			return unchecked()
		}
		k, err := s.stringValue(text)
		if err != nil || !s.next(':') {
			return unchecked()
		}
		switch b, _ := s.peek(); b {
		case '"':
			v, err := s.stringValue(text)
			if err != nil {
				return err
			}
			c.Metadata[k] = v
		case 'n':
			if err := s.literal("null"); err != nil {
				return unchecked()
			}
			c.Metadata[k] = ""
		default:
			return wrongType(i, jsonType(b))
		}
		if s.next('}') {
			return nil
		}
		if !s.next(',') {
			return unchecked()
		}
	}
}

// stringValue reads a string and returns it decoded: a slice of text, the
// body as a string, when it has no escapes, and as encoding/json decodes it
// when it has.
func (s *scanner) stringValue(text string) (string, error) {
	start, end, escaped, err := s.str()
	if err != nil {
		return "", unchecked()
	}
	if !escaped {
		return text[start:end], nil
	}
	var v string
	if err := json.Unmarshal(s.data[start-1:end+1], &v); err != nil {
		return "", unchecked()
	}
	return v, nil
}

// wrongType is the error for commandFields[i] holding a JSON value of the
// wrong type; got names the value as encoding/json does ("string",
// "number 1e2").
func wrongType(i int, got string) error {
	f := commandFields[i]
	switch f.name {
	case "amount":
		return invalid(f.reason, f.name, "must be an integer in minor units within int64, got JSON %s", clip(got))
	case "metadata":
		return invalid(f.reason, f.name, "must be an object of strings")
	}
	return invalid(f.reason, f.name, "must be a string")
}

// jsonType names the type of the JSON value, not null, starting with b, as
// encoding/json's type errors do.
func jsonType(b byte) string {
	switch b {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "bool"
	}
	return "number"
}
