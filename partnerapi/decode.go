package partnerapi

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The tolerant decoders of the API's answers. Each accepts the live and the
// standby shapes the spec lists, ignores unknown fields, and fails (never
// panics) on anything else; FuzzDecoders holds them to that.

// sessionToken is session.token: the JWT string itself (standby, with-user)
// or an object {token, error} (live).
type sessionToken struct {
	value  string
	errMsg string
}

func (t *sessionToken) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case len(data) == 0 || string(data) == "null":
		return nil
	case data[0] == '"':
		return json.Unmarshal(data, &t.value)
	case data[0] == '{':
		var o struct {
			Token *string `json:"token"`
			Error *string `json:"error"`
		}
		if err := json.Unmarshal(data, &o); err != nil {
			return err
		}
		if o.Token != nil {
			t.value = *o.Token
		}
		if o.Error != nil {
			t.errMsg = *o.Error
		}
		return nil
	}
	return errors.New("session.token is neither a string nor an object")
}

// decodeSession extracts the JWT: if session.token is a string it is the
// token, else session.token.token (spec: Session response).
func decodeSession(data []byte) (string, error) {
	var b struct {
		Session *struct {
			Token sessionToken `json:"token"`
		} `json:"session"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return "", err
	}
	if b.Session == nil {
		return "", errors.New("no session object")
	}
	tok := b.Session.Token
	if tok.value == "" {
		if tok.errMsg != "" {
			// The message comes from the server: bounded, and never a token.
			return "", errors.New("session.token.error: " + bound(printable(tok.errMsg), maxReasonLen))
		}
		return "", errors.New("no session token")
	}
	if !validHeaderToken(tok.value) {
		return "", errors.New("session token has characters not allowed in a header")
	}
	return tok.value, nil
}

// validHeaderToken reports whether s can be sent as a header value as is:
// visible ASCII only (a JWT is base64url segments and dots).
func validHeaderToken(s string) bool {
	if len(s) > 16<<10 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// jwtExpiry reads the exp claim of a JWT when there is one. The spec does not
// document the claims, so its absence is normal.
func jwtExpiry(jwt string) (time.Time, bool) {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp json.Number `json:"exp"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp == "" {
		return time.Time{}, false
	}
	f, err := claims.Exp.Float64()
	if err != nil || f <= 0 || f > 1e11 {
		return time.Time{}, false
	}
	return time.Unix(int64(f), 0), true
}

// The ranked collections come back in display order: the spec gives the
// order by a field (catalog and page list `ranking`, genre row `ordering`,
// ascending), never by the position in the array or by the ids. Equal ranks
// keep the order the API sent them in.

func decodeCatalog(data []byte) ([]CatalogEntry, error) {
	var b struct {
		Catalogs []CatalogEntry `json:"catalogs"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, err
	}
	slices.SortStableFunc(b.Catalogs, func(x, y CatalogEntry) int { return cmp.Compare(x.Ranking, y.Ranking) })
	return b.Catalogs, nil
}

func decodePage(data []byte) (Page, error) {
	var b struct {
		Page *Page `json:"page"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return Page{}, err
	}
	if b.Page == nil {
		return Page{}, errors.New("no page object")
	}
	slices.SortStableFunc(b.Page.Lists, func(x, y PageList) int { return cmp.Compare(x.Ranking, y.Ranking) })
	return *b.Page, nil
}

func decodeList(data []byte) (List, error) {
	var b struct {
		List *List `json:"list"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return List{}, err
	}
	if b.List == nil {
		return List{}, errors.New("no list object")
	}
	return *b.List, nil
}

func decodeGenreRow(data []byte) (GenreRow, error) {
	var b struct {
		Rows *GenreRow `json:"rows"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return GenreRow{}, err
	}
	if b.Rows == nil {
		return GenreRow{}, errors.New("no rows object")
	}
	slices.SortStableFunc(b.Rows.Items, func(x, y GenreRowItem) int { return cmp.Compare(x.Ordering, y.Ordering) })
	return *b.Rows, nil
}

func decodeMix(data []byte) (Mix, error) {
	var b struct {
		Mix *Mix `json:"mix"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return Mix{}, err
	}
	if b.Mix == nil {
		return Mix{}, errors.New("no mix object")
	}
	return *b.Mix, nil
}

// UnmarshalJSON decodes a DJ tolerantly: the spec's object, a bare string
// (taken as the name), or null.
func (d *DJ) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case len(data) == 0 || string(data) == "null":
		*d = DJ{}
		return nil
	case data[0] == '"':
		*d = DJ{}
		return json.Unmarshal(data, &d.Name)
	}
	type plain DJ
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	*d = DJ(p)
	return nil
}

// errorReason extracts the reason of an error answer: the envelope's reason
// or message (JSON), else the text body (e.g. the plain-text "Unauthorized"
// or an edge page), reduced to printable characters, scrubbed of secrets by
// scrub, then bounded: scrubbed before it is cut, so that a secret the cut
// would split is still found whole.
func errorReason(status int, body []byte, scrub func(string) string) string {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '{' {
		var env struct {
			Reason  *string `json:"reason"`
			Message *string `json:"message"`
		}
		if json.Unmarshal(body, &env) == nil {
			switch {
			case env.Reason != nil && *env.Reason != "":
				return bound(scrub(printable(*env.Reason)), maxReasonLen)
			case env.Message != nil:
				return bound(scrub(printable(*env.Message)), maxReasonLen)
			}
		}
	}
	if status == http.StatusForbidden && bytes.Contains(body, []byte("1010")) {
		return "edge error 1010: User-Agent blocked"
	}
	return bound(scrub(printable(string(body[:min(len(body), scrubSpan)]))), 200)
}

// scrubSpan is how much of a text answer is scrubbed before it is cut to a
// few hundred bytes: enough for any secret straddling the cut (a token is
// about 1 KiB), without scanning a whole page.
const scrubSpan = 8 << 10

// printable drops control characters and invalid UTF-8 from text that came
// from the server.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r < ' ' || r == 0x7f || r == utf8.RuneError {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n' || r == '\t' || r == '\r':
			b.WriteByte(' ')
		case r < ' ' || r == 0x7f || r == utf8.RuneError:
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// The clauses of a 400 play report message that name fields: the spec's
// "include the required fields: a,b" and the sandbox's "wrongly typed
// optional fields: c" (docs/sandbox.md); clauses are separated by ";".
var fieldsPrefixes = [...]string{"include the required fields:", "wrongly typed optional fields:"}

// parseFields extracts the offending fields from a message made of the
// clauses above (case-insensitive prefixes, spaces around names ignored),
// in the order they appear. Nil when no clause is of that form.
func parseFields(msg string) []string {
	var out []string
	for clause := range strings.SplitSeq(msg, ";") {
		for _, prefix := range fieldsPrefixes {
			i := indexFoldASCII(clause, prefix)
			if i < 0 {
				continue
			}
			for f := range strings.SplitSeq(clause[i+len(prefix):], ",") {
				if f = strings.TrimSpace(f); f != "" {
					out = append(out, f)
				}
			}
			break
		}
	}
	return out
}

// indexFoldASCII is strings.Index ignoring ASCII case (sub in lower case),
// with byte offsets into s whatever else s holds.
func indexFoldASCII(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		j := 0
		for j < len(sub) {
			b := s[i+j]
			if 'A' <= b && b <= 'Z' {
				b += 'a' - 'A'
			}
			if b != sub[j] {
				break
			}
			j++
		}
		if j == len(sub) {
			return i
		}
	}
	return -1
}

// parseRetryAfter reads Retry-After as delay-seconds or an HTTP-date; zero
// when absent, malformed or in the past.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		if n > 24*3600 {
			n = 24 * 3600
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return min(d, 24*time.Hour)
		}
	}
	return 0
}

// reportMessage extracts "message" from a play report answer
// ({"error":false,"message":"ok"}) without encoding/json on the common path,
// reusing the previous string when the word is the same.
func (c *Client) reportMessage(body []byte) string {
	raw, ok := findStringField(body, `"message"`)
	if !ok {
		var m struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &m) != nil {
			return ""
		}
		return bound(printable(m.Message), maxReasonLen)
	}
	if p := c.lastMessage.Load(); p != nil && *p == string(raw) {
		return *p
	}
	s := bound(printable(string(raw)), maxReasonLen)
	c.lastMessage.Store(&s)
	return s
}

// findStringField finds key (with quotes) followed by a colon and a JSON
// string without escapes, returning the string's bytes. ok is false when the
// key is absent, appears more than once, or the value is not such a string:
// the caller then falls back to encoding/json.
func findStringField(body []byte, key string) ([]byte, bool) {
	i := bytes.Index(body, []byte(key))
	if i < 0 || bytes.Contains(body[i+len(key):], []byte(key)) {
		return nil, false
	}
	rest := bytes.TrimLeft(body[i+len(key):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return nil, false
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '"' {
		return nil, false
	}
	rest = rest[1:]
	end := bytes.IndexByte(rest, '"')
	if end < 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return nil, false
	}
	return rest[:end], true
}
