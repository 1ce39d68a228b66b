package sandbox

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash/maphash"
	"strings"
	"sync"
	"time"
)

// Session tokens are real HS256 JWTs. Claims:
//
//	iss "playpipe-partner-sandbox", sub client_id, iat, exp, jti (random),
//	pid partner id (only for /session/with-user in live service),
//	sby standby episode (only for tokens minted in standby; the token dies
//	    when that episode ends),
//	rev revocation generation at minting (omitted while 0; the token dies
//	    at the next Server.RevokeTokens).

const jwtIssuer = "playpipe-partner-sandbox"

var jwtHeader = base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))

type claims struct {
	Iss string `json:"iss"`
	Sub string `json:"sub"`
	Iat int64  `json:"iat"`
	Exp int64  `json:"exp"`
	Jti string `json:"jti"`
	Pid string `json:"pid,omitempty"`
	Sby uint64 `json:"sby,omitempty"`
	Rev uint64 `json:"rev,omitempty"`
}

// errToken is returned for every token that does not verify; the cause is
// never shown to the caller (the answer is always 401 "Unauthorized").
var errToken = errors.New("sandbox: token rejected")

type signer struct {
	secret []byte
	pool   sync.Pool // of hash.Hash (hmac) — hmac.New is not free
	cache  tokenCache
}

func newSigner(secret []byte) *signer {
	s := &signer{secret: append([]byte(nil), secret...)}
	s.pool.New = func() any { return hmac.New(sha256.New, s.secret) }
	s.cache.init()
	return s
}

func (s *signer) mac(data string) []byte {
	h := s.pool.Get().(interface {
		Write([]byte) (int, error)
		Sum([]byte) []byte
		Reset()
	})
	h.Reset()
	h.Write([]byte(data))
	sum := h.Sum(nil)
	s.pool.Put(h)
	return sum
}

func (s *signer) mint(c claims) string {
	var jti [8]byte
	_, _ = rand.Read(jti[:])
	c.Iss, c.Jti = jwtIssuer, hex.EncodeToString(jti[:])
	payload, _ := json.Marshal(c)
	unsigned := jwtHeader + "." + base64.RawURLEncoding.EncodeToString(payload)
	return unsigned + "." + base64.RawURLEncoding.EncodeToString(s.mac(unsigned))
}

// verify checks the signature and the expiry of tok and returns its claims.
// Verified tokens are cached, so a token used for many requests costs one
// map look-up after the first; the expiry is checked on every call.
func (s *signer) verify(tok string, now time.Time) (claims, error) {
	if c, ok := s.cache.get(tok); ok {
		if now.Unix() >= c.Exp {
			return claims{}, errToken
		}
		return c, nil
	}
	c, err := s.verifySlow(tok)
	if err != nil {
		return claims{}, err
	}
	if now.Unix() >= c.Exp {
		return claims{}, errToken
	}
	s.cache.put(tok, c)
	return c, nil
}

func (s *signer) verifySlow(tok string) (claims, error) {
	if len(tok) > 4096 {
		return claims{}, errToken
	}
	head, rest, ok := strings.Cut(tok, ".")
	if !ok {
		return claims{}, errToken
	}
	payload, sig, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(sig, ".") {
		return claims{}, errToken
	}
	hb, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return claims{}, errToken
	}
	var h struct {
		Alg string `json:"alg"`
		Typ string `json:"typ"`
	}
	if json.Unmarshal(hb, &h) != nil || h.Alg != "HS256" {
		return claims{}, errToken // "none" and every other algorithm are refused
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(head+"."+payload)) {
		return claims{}, errToken
	}
	pb, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return claims{}, errToken
	}
	var c claims
	if json.Unmarshal(pb, &c) != nil || c.Iss != jwtIssuer || c.Exp == 0 {
		return claims{}, errToken
	}
	return c, nil
}

// tokenCache is a small sharded cache of verified tokens. A full shard is
// emptied (tokens are few; a flood of distinct tokens just costs re-verification).
type tokenCache struct {
	seed   maphash.Seed
	shards [16]struct {
		mu sync.RWMutex
		m  map[string]claims
	}
}

const tokenCacheShardCap = 256

func (c *tokenCache) init() {
	c.seed = maphash.MakeSeed()
	for i := range c.shards {
		c.shards[i].m = make(map[string]claims)
	}
}

func (c *tokenCache) shard(tok string) int {
	return int(maphash.String(c.seed, tok) % uint64(len(c.shards)))
}

func (c *tokenCache) get(tok string) (claims, bool) {
	sh := &c.shards[c.shard(tok)]
	sh.mu.RLock()
	v, ok := sh.m[tok]
	sh.mu.RUnlock()
	return v, ok
}

func (c *tokenCache) put(tok string, v claims) {
	sh := &c.shards[c.shard(tok)]
	sh.mu.Lock()
	if len(sh.m) >= tokenCacheShardCap {
		clear(sh.m)
	}
	sh.m[tok] = v
	sh.mu.Unlock()
}
