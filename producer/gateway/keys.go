package gateway

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// FleetKey is one fleet's API key as the gateway stores it: the SHA-256 of
// the key, never the key itself. A fleet may have several keys (rotation);
// each key has its own rate limit.
type FleetKey struct {
	Fleet string
	Hash  [sha256.Size]byte
}

// HashKey returns the hex SHA-256 of an API key: what the gateway's key
// configuration holds ("fleet:<HashKey(key)>").
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// ErrBadKeySpec is returned for a key configuration entry that is not fleet:hexsha256.
var ErrBadKeySpec = errors.New("gateway: API key entry must be fleet-name:hex-sha256 (64 hex digits)")

// ParseFleetKey parses "fleet-name:hexsha256". The error never repeats the
// entry (it might be a raw key pasted by mistake).
func ParseFleetKey(s string) (FleetKey, error) {
	name, hexsum, ok := strings.Cut(strings.TrimSpace(s), ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t") {
		return FleetKey{}, ErrBadKeySpec
	}
	sum, err := hex.DecodeString(strings.TrimSpace(hexsum))
	if err != nil || len(sum) != sha256.Size {
		return FleetKey{}, fmt.Errorf("%w (fleet %q)", ErrBadKeySpec, name)
	}
	k := FleetKey{Fleet: name}
	copy(k.Hash[:], sum)
	return k, nil
}

// ParseFleetKeys parses one entry per line (blank lines and lines starting
// with # are skipped), as in an API key file.
func ParseFleetKeys(r io.Reader) ([]FleetKey, error) {
	var out []FleetKey
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := ParseFleetKey(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, k)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("gateway: read API keys: %w", err)
	}
	return out, nil
}

// keyring matches presented keys against the configured hashes.
type keyring struct{ keys []FleetKey }

func newKeyring(keys []FleetKey) (*keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("gateway: Config.Keys is empty: configure at least one fleet API key (fleet-name:hex-sha256)")
	}
	seen := map[[sha256.Size]byte]string{}
	for _, k := range keys {
		if k.Fleet == "" {
			return nil, errors.New("gateway: Config.Keys: a key without a fleet name")
		}
		if other, dup := seen[k.Hash]; dup {
			return nil, fmt.Errorf("gateway: Config.Keys: fleets %q and %q share the same key hash", other, k.Fleet)
		}
		seen[k.Hash] = k.Fleet
	}
	return &keyring{keys: append([]FleetKey(nil), keys...)}, nil
}

// match returns the index of the key whose hash equals SHA-256(key), or -1.
// Every configured hash is compared in constant time, whatever matches.
func (kr *keyring) match(key string) int {
	if key == "" {
		return -1
	}
	sum := sha256.Sum256([]byte(key))
	found := -1
	for i := range kr.keys {
		if subtle.ConstantTimeCompare(sum[:], kr.keys[i].Hash[:]) == 1 {
			found = i
		}
	}
	return found
}

// presentedKey reads the API key of a request: "Authorization: Bearer <key>"
// or "X-API-Key: <key>".
func presentedKey(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, key, ok := strings.Cut(h, " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(key)
		}
		return ""
	}
	return strings.TrimSpace(r.Header.Get("X-API-Key"))
}
