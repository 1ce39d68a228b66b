package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
)

// bodyKind maps a Content-Type to the body format: ndjson true for the
// NDJSON types, false for JSON and the generic types (sniffed: a body
// starting with '[' is an array, anything else NDJSON); known is false for
// types the gateway does not take.
func bodyKind(contentType string) (ndjson, known bool) {
	if contentType == "" {
		return false, true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false, false
	}
	switch mt {
	case "application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines", "application/jsonlines":
		return true, true
	case "application/json", "text/plain", "application/octet-stream",
		"application/x-www-form-urlencoded": // curl -d's default: the body is sniffed
		return false, true
	}
	return false, false
}

var errTooManyEvents = errors.New("too many events")

// splitBatch splits a body into raw events: a JSON array (unless ndjson),
// else one event per non-blank line (without its \n or \r\n). Each element is returned verbatim; an
// element that is not a valid event is left to ParseEvent to refuse, but a
// JSON array that does not parse is an error for the whole batch.
func splitBatch(body []byte, ndjson bool, maxEvents int) ([][]byte, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if !ndjson && len(trimmed) > 0 && trimmed[0] == '[' {
		return splitArray(trimmed, maxEvents)
	}
	if bytes.Count(body, []byte{'\n'}) >= maxEvents { // cheap upper bound before splitting
		n := 0
		for _, line := range bytes.Split(body, []byte{'\n'}) {
			if len(bytes.TrimSpace(line)) > 0 {
				n++
			}
		}
		if n > maxEvents {
			return nil, errTooManyEvents
		}
	}
	var out [][]byte
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		// Only the line terminator goes: the event's bytes stay verbatim (a
		// refused one is recorded byte for byte). Blank lines are skipped.
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if len(bytes.TrimSpace(line)) > 0 {
			out = append(out, line)
		}
	}
	return out, nil
}

func splitArray(body []byte, maxEvents int) ([][]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("the body is not a JSON array: %w", err)
	}
	var out [][]byte
	for dec.More() {
		if len(out) == maxEvents {
			return nil, errTooManyEvents
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("malformed JSON array at element %d: %w", len(out), err)
		}
		out = append(out, raw)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("malformed JSON array: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("malformed JSON array: data after the closing ]")
	}
	return out, nil
}
