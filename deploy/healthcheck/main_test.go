package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.WriteHeader(http.StatusOK)
			return
		}
		http.Error(w, "not ready: kafka", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{srv.URL + "/readyz"}, 0, ""},
		{[]string{srv.URL + "/readyz", srv.URL + "/healthz"}, 1, "503 Service Unavailable: not ready: kafka"},
		{nil, 2, "usage"},
		{[]string{"127.0.0.1:9460/readyz"}, 2, "not an http:// URL"},
	} {
		var stderr bytes.Buffer
		if code := run(tc.args, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.msg) {
			t.Errorf("run(%q) = %d, %q; want %d, %q", tc.args, code, stderr.String(), tc.code, tc.msg)
		}
	}
}
