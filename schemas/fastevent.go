package schemas

import "unicode/utf8"

// The fast path of ParseEvent: a single pass over the bytes of a flat player
// event object that fills a rawEvent exactly as json.Unmarshal would, without
// reflection. It only ever answers for input it fully understands; on
// anything else (duplicate keys, keys that may equal a field name but for
// case, wrong JSON types, numbers that are not plain int64
// literals, deep nesting, any syntax error, …) it gives up and ParseEvent
// takes the encoding/json path, which then decides. Callers check utf8.Valid
// on the whole input first, so strings need no UTF-8 validation here.
// FuzzParseEventFastVsSlow holds both paths to the same results.

// Indexes of the known fields in fastValues (schema order within each kind).
const (
	fsEventID = iota
	fsUserID
	fsCountry
	fsOS
	fsDevice
	fsSourceStream
	numFastStrings
)

const (
	fiMixID = iota
	fiStartedAt
	fiOffsetMS
	fiDurationMS
	fiVendor
	fiEndReason
	numFastInts
)

const (
	fbCached = iota
	fbJumpForward
	numFastBools
)

// fastValues backs the pointers of a rawEvent filled by the fast path, so
// that one allocation holds every scalar.
type fastValues struct {
	strs  [numFastStrings]string
	ints  [numFastInts]int64
	bools [numFastBools]bool
}

// maxFastUnknown is the most unknown keys the fast path checks for
// duplicates (pairwise); an event with more goes to the slow path.
const maxFastUnknown = 8

// fastKey maps an exactly spelled known key to its kind and index.
func fastKey(key []byte) (kind byte, idx int, ok bool) {
	switch string(key) {
	case "event_id":
		return 's', fsEventID, true
	case "mix_id":
		return 'i', fiMixID, true
	case "started_at":
		return 'i', fiStartedAt, true
	case "offset_ms":
		return 'i', fiOffsetMS, true
	case "duration_ms":
		return 'i', fiDurationMS, true
	case "user_id":
		return 's', fsUserID, true
	case "country":
		return 's', fsCountry, true
	case "os":
		return 's', fsOS, true
	case "device":
		return 's', fsDevice, true
	case "vendor":
		return 'i', fiVendor, true
	case "source_stream":
		return 's', fsSourceStream, true
	case "cached":
		return 'b', fbCached, true
	case "jump_forward":
		return 'b', fbJumpForward, true
	case "end_reason":
		return 'i', fiEndReason, true
	}
	return 0, 0, false
}

// seenBit is the presence bit of a known field, for duplicate detection.
func seenBit(kind byte, idx int) uint32 {
	switch kind {
	case 's':
		return 1 << idx
	case 'i':
		return 1 << (numFastStrings + idx)
	default:
		return 1 << (numFastStrings + numFastInts + idx)
	}
}

// mayFoldToKnown reports whether encoding/json could match key to a field
// case-insensitively: only keys with an upper-case ASCII letter or a
// non-ASCII byte can (a lower-case ASCII key matches only by its exact
// spelling, which fastKey already tried).
func mayFoldToKnown(key []byte) bool {
	for _, c := range key {
		if c >= utf8.RuneSelf || ('A' <= c && c <= 'Z') {
			return true
		}
	}
	return false
}

// eventDecoder is the state of one fast decoding of an event.
type eventDecoder struct {
	seen  uint32 // known fields with a value
	nulls uint32 // known fields given as null
	// Strings without escapes are kept as spans of raw and copied out with
	// one conversion at the end; decoded ones are kept as is.
	spans   [numFastStrings][2]int
	decoded [numFastStrings]bool
	vals    fastValues
	lo, hi  int
	// Unknown keys seen so far (plain, so their bytes are the key): a
	// duplicate is a violation the slow path reports.
	unknown  [maxFastUnknown][]byte
	nUnknown int
}

// fastDecodeEvent fills r from raw and reports true when raw is one JSON
// object whose known fields all have their JSON type (or null) and appear at
// most once; it reports false, with r in an unspecified state, whenever
// encoding/json has to decide. It reads raw with the package's one JSON
// scanner (jsonscan.go).
func fastDecodeEvent(raw []byte, r *rawEvent) bool {
	d := eventDecoder{lo: len(raw)}
	p := newJSONScanner(raw)
	if !p.Open('{') {
		return false
	}
	for first := true; p.More('}', &first); {
		if !d.member(&p) {
			return false
		}
	}
	if !p.End() {
		return false // invalid JSON or trailing bytes after the object
	}
	d.fill(raw, r)
	return true
}

// member decodes one member of the event object; false: encoding/json decides.
func (d *eventDecoder) member(p *jsonScanner[[]byte]) bool {
	key := p.Key() // plain ASCII: an escaped key may spell a known one
	if p.Bad() {
		return false
	}
	kind, idx, known := fastKey(key)
	if !known {
		return d.unknownMember(p, key)
	}
	bit := seenBit(kind, idx)
	if (d.seen|d.nulls)&bit != 0 {
		return false // duplicate key: the slow path reports it
	}
	if p.Null() {
		d.nulls |= bit // null leaves the pointer nil
		return true
	}
	d.seen |= bit
	switch kind {
	case 's':
		d.str(p, idx)
	case 'i':
		v, _ := p.Integer(64)
		d.vals.ints[idx] = v
	default: // 'b'
		p.Bool(&d.vals.bools[idx])
	}
	return !p.Bad()
}

// unknownMember skips the value of a key no field takes.
func (d *eventDecoder) unknownMember(p *jsonScanner[[]byte], key []byte) bool {
	if mayFoldToKnown(key) || d.nUnknown == maxFastUnknown {
		return false
	}
	for _, u := range d.unknown[:d.nUnknown] {
		if string(u) == string(key) {
			return false // duplicate key: the slow path reports it
		}
	}
	d.unknown[d.nUnknown] = key
	d.nUnknown++
	p.Skip()
	return !p.Bad()
}

// str reads the string value of known string field idx.
func (d *eventDecoder) str(p *jsonScanner[[]byte], idx int) {
	tok, plain := p.StrToken()
	if p.Bad() {
		return
	}
	end := p.Pos() - 1 // the closing quote
	start := end - (len(tok) - 2)
	if plain {
		d.spans[idx] = [2]int{start, end}
		d.lo, d.hi = min(d.lo, start), max(d.hi, end)
		return
	}
	d.vals.strs[idx], d.decoded[idx] = unquoteJSON(tok[1:len(tok)-1]), true
}

// fill sets r from a successful decoding of raw: the plain strings are
// copied out with one conversion, and one allocation backs every pointer.
func (d *eventDecoder) fill(raw []byte, r *rawEvent) {
	var src string
	if d.lo < d.hi {
		src = string(raw[d.lo:d.hi])
	}
	vp := new(fastValues)
	*vp = d.vals
	seen := d.seen
	for k := 0; k < numFastStrings; k++ {
		if seen&seenBit('s', k) != 0 && !d.decoded[k] {
			vp.strs[k] = src[d.spans[k][0]-d.lo : d.spans[k][1]-d.lo]
		}
	}
	str := func(k int) *string {
		if seen&seenBit('s', k) == 0 {
			return nil
		}
		return &vp.strs[k]
	}
	num := func(k int) *int64 {
		if seen&seenBit('i', k) == 0 {
			return nil
		}
		return &vp.ints[k]
	}
	boolean := func(k int) *bool {
		if seen&seenBit('b', k) == 0 {
			return nil
		}
		return &vp.bools[k]
	}
	*r = rawEvent{
		EventID: str(fsEventID), MixID: num(fiMixID), StartedAt: num(fiStartedAt),
		OffsetMS: num(fiOffsetMS), DurationMS: num(fiDurationMS), UserID: str(fsUserID),
		Country: str(fsCountry), OS: str(fsOS), Device: str(fsDevice), Vendor: num(fiVendor),
		SourceStream: str(fsSourceStream), Cached: boolean(fbCached), JumpForward: boolean(fbJumpForward),
		EndReason: num(fiEndReason),
	}
}
