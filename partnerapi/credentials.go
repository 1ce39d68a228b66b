package partnerapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// redacted replaces every secret in printed output.
const redacted = "[REDACTED]"

// Credentials are the partner credentials issued out of band. ClientSignature
// is a secret: every way of printing a Credentials (fmt verbs including %#v,
// slog, encoding/json) shows it as [REDACTED]. Read it only to send it.
type Credentials struct {
	// ClientID is the partner's client_id (10 characters per the spec).
	ClientID string
	// ClientSignature is the client_signature (40 characters per the spec).
	// Never passed on a command line: environment or credentials file only.
	ClientSignature string
	// Email is the partner account e-mail registered for ClientID. When set,
	// RestrictedCatalog uses a token from POST /partners/session/with-user.
	Email string
}

func redact(secret string) string {
	if secret == "" {
		return ""
	}
	return redacted
}

// String prints the credentials with the signature redacted.
func (c Credentials) String() string {
	return fmt.Sprintf("{ClientID:%s ClientSignature:%s Email:%s}", c.ClientID, redact(c.ClientSignature), c.Email)
}

// GoString prints the credentials as Go syntax with the signature redacted.
func (c Credentials) GoString() string {
	return fmt.Sprintf("partnerapi.Credentials{ClientID:%q, ClientSignature:%q, Email:%q}", c.ClientID, redact(c.ClientSignature), c.Email)
}

// Format implements fmt.Formatter so that no verb (%v, %+v, %#v, %s, %q, %x…)
// can reach the signature.
func (c Credentials) Format(f fmt.State, verb rune) {
	switch {
	case verb == 'v' && f.Flag('#'):
		_, _ = io.WriteString(f, c.GoString())
	case verb == 'q':
		_, _ = fmt.Fprintf(f, "%q", c.String())
	default:
		_, _ = io.WriteString(f, c.String())
	}
}

// LogValue implements slog.LogValuer with the signature redacted.
func (c Credentials) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("client_id", c.ClientID),
		slog.String("client_signature", redact(c.ClientSignature)),
		slog.String("email", c.Email),
	)
}

// MarshalJSON encodes the credentials with the signature redacted, so that a
// configuration dumped as JSON never carries the secret.
func (c Credentials) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ClientID        string `json:"client_id"`
		ClientSignature string `json:"client_signature"`
		Email           string `json:"email,omitempty"`
	}{c.ClientID, redact(c.ClientSignature), c.Email})
}

// LoadCredentialsFile reads credentials from a file in one of two forms:
//
//   - JSON: {"client_id": "…", "client_signature": "…", "email": "…"}
//   - lines KEY=VALUE (blank lines and lines starting with # ignored), keys
//     client_id, client_signature, email or their environment names
//     PLAYPIPE_API_CLIENT_ID, PLAYPIPE_API_CLIENT_SIGNATURE, PLAYPIPE_API_EMAIL;
//     values may be wrapped in single or double quotes.
//
// Errors name the file and the line, never a value.
func LoadCredentialsFile(path string) (Credentials, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("partnerapi: credentials file: %w", err)
	}
	return parseCredentials(path, data)
}

func parseCredentials(name string, data []byte) (Credentials, error) {
	var c Credentials
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		var f struct {
			ClientID        string `json:"client_id"`
			ClientSignature string `json:"client_signature"`
			Email           string `json:"email"`
		}
		if err := json.Unmarshal(trimmed, &f); err != nil {
			// The JSON error may quote part of the file: report only its kind.
			return c, fmt.Errorf("partnerapi: credentials file %s: not valid JSON (want {\"client_id\":…,\"client_signature\":…,\"email\":…})", name)
		}
		return Credentials{ClientID: f.ClientID, ClientSignature: f.ClientSignature, Email: f.Email}, nil
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || s[0] == '#' {
			continue
		}
		s = strings.TrimPrefix(s, "export ")
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			return c, fmt.Errorf("partnerapi: credentials file %s:%d: want KEY=VALUE", name, line)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		switch strings.ToLower(k) {
		case "client_id", "playpipe_api_client_id":
			c.ClientID = v
		case "client_signature", "playpipe_api_client_signature":
			c.ClientSignature = v
		case "email", "playpipe_api_email":
			c.Email = v
		default:
			return c, fmt.Errorf("partnerapi: credentials file %s:%d: unknown key %q (accepted: client_id, client_signature, email)", name, line, k)
		}
	}
	if err := sc.Err(); err != nil {
		return c, fmt.Errorf("partnerapi: credentials file %s: %w", name, err)
	}
	return c, nil
}
