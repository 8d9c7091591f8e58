// Package sluice is the limiter of libsluice.so (sluice's C ABI,
// include/sluice.h) for Go, through cgo. The semantics (quotas, levels,
// the decision, sync) are the library's; this package converts arguments,
// results and errors only.
//
//	lim, err := sluice.New(sluice.Config{"roots": []string{"http://127.0.0.1:7070"}})
//	if err != nil { ... }
//	defer lim.Close()
//	if res, err := lim.Check("api_acme", 1); err == nil && !res.Allowed() {
//		// over the quota: answer 429
//	}
//
// Building: the cgo flags below find the header and the library in this
// repository (`make lib` builds target/release/libsluice.so) and record its
// directory as the run path. Elsewhere, set CGO_CFLAGS=-I<dir of sluice.h>
// and CGO_LDFLAGS=-L<dir of libsluice.so> (and LD_LIBRARY_PATH to run).
//
// There is one limiter per process (the C ABI's), so one Limiter at a time.
package sluice

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -L${SRCDIR}/../../target/release -Wl,-rpath,${SRCDIR}/../../target/release -lsluice
#include <stdlib.h>
#include <string.h>
#include "sluice.h"

// The library keeps its last error per thread, and a goroutine may move to
// another thread between two cgo calls: each wrapper reads the error in the
// same C call as the failing function, and copies it (Go frees it).
typedef struct {
	int code;
	char *err;
} go_result;

static go_result go_wrap(int code) {
	go_result r = {code, NULL};
	if (code == SLUICE_ERROR) r.err = strdup(sluice_last_error());
	return r;
}

// Go strings are passed as they are (pointer and length): no copy per
// check. A new C function is one wrapper here and one method in Go.
// Calls fn with s as a C string (the functions taking NUL-terminated text).
static go_result go_with_cstr(int (*fn)(const char *), _GoString_ s) {
	char *c = strndup(_GoStringPtr(s), _GoStringLen(s));
	if (c == NULL) {
		go_result oom = {SLUICE_ERROR, strdup("out of memory")};
		return oom;
	}
	go_result r = go_wrap(fn(c));
	free(c);
	return r;
}
static go_result go_init(_GoString_ config) { return go_with_cstr(sluice_init, config); }
static go_result go_load_quotas_json(_GoString_ json) {
	return go_with_cstr(sluice_load_quotas_json, json);
}
static go_result go_load_quotas_file(_GoString_ path) {
	return go_with_cstr(sluice_load_quotas_file, path);
}
static go_result go_check(_GoString_ name, uint64_t weight) {
	return go_wrap(sluice_check(_GoStringPtr(name), _GoStringLen(name), weight));
}
static go_result go_check_key(_GoString_ name, _GoString_ key, uint64_t weight) {
	return go_wrap(sluice_check_key(_GoStringPtr(name), _GoStringLen(name),
		_GoStringPtr(key), _GoStringLen(key), weight));
}
// charge and settle: a key of NULL means the quota itself.
static go_result go_charge(_GoString_ name, _GoString_ key, int keyed, uint64_t weight) {
	if (!keyed) return go_wrap(sluice_charge(_GoStringPtr(name), _GoStringLen(name), weight));
	return go_wrap(sluice_charge_key(_GoStringPtr(name), _GoStringLen(name),
		_GoStringPtr(key), _GoStringLen(key), weight));
}
static go_result go_settle(_GoString_ name, _GoString_ key, int keyed, uint64_t reserved,
		uint64_t actual) {
	if (!keyed) {
		return go_wrap(sluice_settle(_GoStringPtr(name), _GoStringLen(name), reserved, actual));
	}
	return go_wrap(sluice_settle_key(_GoStringPtr(name), _GoStringLen(name),
		_GoStringPtr(key), _GoStringLen(key), reserved, actual));
}
// obtain and reserve write their second result through `out`; a key of
// NULL means the quota itself (not a per-key quota's key).
static go_result go_obtain(_GoString_ name, _GoString_ key, int keyed, uint64_t want,
		uint64_t *out) {
	if (!keyed) return go_wrap(sluice_obtain(_GoStringPtr(name), _GoStringLen(name), want, out));
	return go_wrap(sluice_obtain_key(_GoStringPtr(name), _GoStringLen(name),
		_GoStringPtr(key), _GoStringLen(key), want, out));
}
static go_result go_reserve(_GoString_ name, _GoString_ key, int keyed, uint64_t weight,
		uint64_t max_wait_ms, uint64_t *out) {
	if (!keyed) {
		return go_wrap(sluice_reserve(_GoStringPtr(name), _GoStringLen(name), weight,
			max_wait_ms, out));
	}
	return go_wrap(sluice_reserve_key(_GoStringPtr(name), _GoStringLen(name),
		_GoStringPtr(key), _GoStringLen(key), weight, max_wait_ms, out));
}
// acquire writes the slot (or NULL) through `out`.
static go_result go_acquire(_GoString_ name, _GoString_ key, int keyed, SluiceSlot **out) {
	if (!keyed) return go_wrap(sluice_acquire(_GoStringPtr(name), _GoStringLen(name), out));
	return go_wrap(sluice_acquire_key(_GoStringPtr(name), _GoStringLen(name),
		_GoStringPtr(key), _GoStringLen(key), out));
}
static go_result go_quota_count(void) { return go_wrap(sluice_quota_count()); }
static go_result go_wait_ready(uint64_t timeout_ms) { return go_wrap(sluice_wait_ready(timeout_ms)); }
static go_result go_shutdown(void) { return go_wrap(sluice_shutdown()); }
static go_result go_sync_metrics_json(char **out) {
	*out = sluice_sync_metrics_json();
	return go_wrap(*out == NULL ? SLUICE_ERROR : SLUICE_PASS);
}
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Result is the answer to a check: Pass, Reject or Unknown.
type Result int

const (
	// Pass: every quota in the chain had room; the weight was counted.
	Pass Result = C.SLUICE_PASS
	// Reject: over a quota (the named one or an ancestor); nothing was counted.
	Reject Result = C.SLUICE_REJECT
	// Unknown: no quota has this name; the request passes, uncounted.
	Unknown Result = C.SLUICE_UNKNOWN
	// NoKey: the quota is per-key and the call gave no key (or an empty
	// one); the request passes, uncounted.
	NoKey Result = C.SLUICE_NO_KEY
	// KeyOverflow: the quota is per-key and its key found no room in a key
	// section full of live keys; the request passes as key_overflow says
	// (counted on the quota's shared counter by default).
	KeyOverflow Result = C.SLUICE_KEY_OVERFLOW
)

// Allowed is true unless the request was rejected (unknown names pass).
func (r Result) Allowed() bool { return r != Reject }

// String is "PASS", "REJECT" or "UNKNOWN", as nginx's $sluice_status.
func (r Result) String() string {
	switch r {
	case Pass:
		return "PASS"
	case Reject:
		return "REJECT"
	case Unknown:
		return "UNKNOWN"
	case NoKey:
		return "NO_KEY"
	case KeyOverflow:
		return "KEY_OVERFLOW"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// Error is a failed sluice call; Message is the library's sluice_last_error().
type Error struct {
	// Call is the C function that failed.
	Call string
	// Message is the library's explanation.
	Message string
}

func (e *Error) Error() string { return "sluice: " + e.Call + ": " + e.Message }

// ErrClosed is returned by calls on a Limiter after Close.
var ErrClosed = errors.New("sluice: the limiter is closed")

// Config is the JSON object sluice_init takes: roots, sync_interval_ms,
// sync_timeout_ms, sync_token, limiter_id, capacity, avg_name_bytes,
// extrapolation, early_sync, key_overflow, no_key, override_capacity
// (include/sluice.h). "no_key": "reject" makes a check of a per-key quota
// without a key Reject (the default, "pass", is NoKey, uncounted, as
// nginx's limit_req). The library validates it and names a bad key in
// the error.
type Config map[string]any

// Limiter is the process-wide limiter of libsluice.
type Limiter struct {
	// closeOnce makes Close idempotent.
	closeOnce sync.Once
	// closed is set by Close; calls after it fail with ErrClosed (and do
	// not reach a limiter started after this one was closed).
	closed atomic.Bool
}

func check(call string, r C.go_result) (int, error) {
	if r.err != nil {
		defer C.free(unsafe.Pointer(r.err))
		return int(r.code), &Error{Call: call, Message: C.GoString(r.err)}
	}
	return int(r.code), nil
}

func jsonText(v any) (string, error) {
	switch t := v.(type) {
	case string:
		return t, nil
	case []byte:
		return string(t), nil
	}
	b, err := json.Marshal(v)
	return string(b), err
}

// New starts the limiter with config (a Config, any value encoding to the
// same JSON object, or JSON text; nil for the defaults). It fails while
// another Limiter is open.
func New(config any) (*Limiter, error) {
	if config == nil {
		config = Config{}
	}
	text, err := jsonText(config)
	if err != nil {
		return nil, fmt.Errorf("sluice: config: %w", err)
	}
	if strings.IndexByte(text, 0) >= 0 {
		return nil, errors.New("sluice: config contains a NUL byte")
	}
	if _, err := check("sluice_init", C.go_init(text)); err != nil {
		return nil, err
	}
	return &Limiter{}, nil
}

// LoadQuotas replaces the quota set with quotas: {"quotas": [...]} or a
// bare array, as a value to encode or as JSON text. Quotas keep their
// counters across loads; an invalid set changes nothing. With roots the
// set only seeds the table: quotas the roots do not have stand in until a
// root's whole quota set has arrived, and the roots' quotas stay.
func (l *Limiter) LoadQuotas(quotas any) error {
	if l.closed.Load() {
		return ErrClosed
	}
	text, err := jsonText(quotas)
	if err != nil {
		return fmt.Errorf("sluice: quotas: %w", err)
	}
	if strings.IndexByte(text, 0) >= 0 {
		return errors.New("sluice: quotas contain a NUL byte")
	}
	_, err = check("sluice_load_quotas_json", C.go_load_quotas_json(text))
	return err
}

// LoadQuotasFile is LoadQuotas reading the JSON file at path.
func (l *Limiter) LoadQuotasFile(path string) error {
	if l.closed.Load() {
		return ErrClosed
	}
	if strings.IndexByte(path, 0) >= 0 {
		return errors.New("sluice: path contains a NUL byte")
	}
	_, err := check("sluice_load_quotas_file", C.go_load_quotas_file(path))
	return err
}

// Check checks quota name (and its ancestors) for weight units, counting
// them if it passes; weight 0 checks without counting. It never blocks.
// On an error (closed limiter, internal error) the C ABI's advice is to
// let the request pass.
func (l *Limiter) Check(name string, weight uint64) (Result, error) {
	if l.closed.Load() {
		return Pass, ErrClosed
	}
	code, err := check("sluice_check", C.go_check(name, C.uint64_t(weight)))
	return Result(code), err
}

// CheckKey checks the key key (any bytes) of the per-key quota name: the
// key's own counter, with the quota's ancestors, counted if it passes.
// An empty key is NoKey (passes, uncounted); a key given for a plain
// quota is ignored. The key is hashed at once and never kept.
func (l *Limiter) CheckKey(name, key string, weight uint64) (Result, error) {
	if l.closed.Load() {
		return Pass, ErrClosed
	}
	code, err := check("sluice_check_key", C.go_check_key(name, key, C.uint64_t(weight)))
	return Result(code), err
}

// Obtain is a partial grant: it counts and returns the most units, up to
// want (at least 1), that quota name and all its ancestors allow with
// certainty now; a sender takes "as many as allowed" for a batch. The
// Result is Pass when something was granted, Reject when nothing can be
// now, Unknown (no such quota: nothing granted; the caller decides).
func (l *Limiter) Obtain(name string, want uint64) (uint64, Result, error) {
	return l.obtain("sluice_obtain", name, "", false, want)
}

// ObtainKey is Obtain on the key key of a per-key quota (NoKey for an
// empty key).
func (l *Limiter) ObtainKey(name, key string, want uint64) (uint64, Result, error) {
	return l.obtain("sluice_obtain_key", name, key, true, want)
}

func (l *Limiter) obtain(call, name, key string, keyed bool, want uint64) (uint64, Result, error) {
	if l.closed.Load() {
		return 0, Pass, ErrClosed
	}
	var granted C.uint64_t
	code, err := check(call, C.go_obtain(name, key, cBool(keyed), C.uint64_t(want), &granted))
	return uint64(granted), Result(code), err
}

// Charge counts weight on quota name (and its ancestors) whatever its
// level: a cost known only after the work is done (bytes sent, tokens
// used, a failed login). It never rejects: past the limit it is a debt,
// and later checks are rejected until it has drained. The Result is Pass
// (counted), Unknown or NoKey (nothing counted), or KeyOverflow.
func (l *Limiter) Charge(name string, weight uint64) (Result, error) {
	return l.charge("sluice_charge", name, "", false, weight)
}

// ChargeKey is Charge on the key key of a per-key quota (NoKey for an
// empty key).
func (l *Limiter) ChargeKey(name, key string, weight uint64) (Result, error) {
	return l.charge("sluice_charge_key", name, key, true, weight)
}

func (l *Limiter) charge(call, name, key string, keyed bool, weight uint64) (Result, error) {
	if l.closed.Load() {
		return Pass, ErrClosed
	}
	code, err := check(call, C.go_charge(name, key, cBool(keyed), C.uint64_t(weight)))
	return Result(code), err
}

// Settle settles an estimate: a passed check of reserved units on quota
// name cost actual in the end. Above the estimate the difference is
// charged (whatever the level); below it, it is given back (uncounted if
// not sent to the roots yet, else returned to them with the next sync).
// Check with an estimate at least the cost (an LLM request's max_tokens)
// so that the fleet never admits more than the limit.
func (l *Limiter) Settle(name string, reserved, actual uint64) (Result, error) {
	return l.settle("sluice_settle", name, "", false, reserved, actual)
}

// SettleKey is Settle on the key key of a per-key quota.
func (l *Limiter) SettleKey(name, key string, reserved, actual uint64) (Result, error) {
	return l.settle("sluice_settle_key", name, key, true, reserved, actual)
}

func (l *Limiter) settle(call, name, key string, keyed bool, reserved, actual uint64) (Result, error) {
	if l.closed.Load() {
		return Pass, ErrClosed
	}
	code, err := check(call, C.go_settle(name, key, cBool(keyed), C.uint64_t(reserved),
		C.uint64_t(actual)))
	return Result(code), err
}

// Never is the wait Reserve reports when waiting cannot help (a weight
// above the quota's high_burst).
const Never = time.Duration(1<<63 - 1)

// Reserve paces: it counts weight on quota name now and returns how long
// to wait before acting so that the whole fleet stays at the quota's rate
// (GCRA's theoretical arrival time on the fleet-wide level). When the
// wait would exceed maxWait (whole milliseconds), nothing is counted: the
// Result is Reject and the wait is what it would have been (Never when
// waiting cannot help). It never sleeps itself: time.Sleep(wait), then act.
func (l *Limiter) Reserve(name string, weight uint64, maxWait time.Duration) (time.Duration, Result, error) {
	return l.reserve("sluice_reserve", name, "", false, weight, maxWait)
}

// ReserveKey is Reserve on the key key of a per-key quota (NoKey for an
// empty key).
func (l *Limiter) ReserveKey(name, key string, weight uint64, maxWait time.Duration) (time.Duration, Result, error) {
	return l.reserve("sluice_reserve_key", name, key, true, weight, maxWait)
}

func (l *Limiter) reserve(call, name, key string, keyed bool, weight uint64, maxWait time.Duration) (time.Duration, Result, error) {
	if l.closed.Load() {
		return 0, Pass, ErrClosed
	}
	if maxWait < 0 {
		maxWait = 0
	}
	var wait C.uint64_t
	code, err := check(call, C.go_reserve(name, key, cBool(keyed), C.uint64_t(weight),
		C.uint64_t(maxWait/time.Millisecond), &wait))
	if uint64(wait) > uint64(Never) {
		return Never, Result(code), err
	}
	return time.Duration(wait), Result(code), err
}

// Slot is a slot of an in-flight quota taken by Acquire: hold it while
// the work it stands for runs, then Release it. Release gives it back
// once (later calls, and calls on a nil Slot, do nothing); a Slot dropped
// unreleased is given back when the garbage collector finalizes it.
type Slot struct {
	ptr atomic.Pointer[C.SluiceSlot]
}

// Release gives the slot back (once).
func (s *Slot) Release() {
	if s == nil {
		return
	}
	if p := s.ptr.Swap(nil); p != nil {
		C.sluice_release(p)
	}
}

// Acquire takes a slot of the in-flight quota name: at most the quota's
// limit are held at once across the fleet. The Slot is nil unless one was
// taken (Pass, or KeyOverflow for a key); Reject when every slot is
// taken. A quota that is not in-flight is an error. It never blocks.
func (l *Limiter) Acquire(name string) (*Slot, Result, error) {
	return l.acquire("sluice_acquire", name, "", false)
}

// AcquireKey is Acquire on the key key of a per-key in-flight quota: each
// key has the quota's limit of its own (NoKey for an empty key).
func (l *Limiter) AcquireKey(name, key string) (*Slot, Result, error) {
	return l.acquire("sluice_acquire_key", name, key, true)
}

func (l *Limiter) acquire(call, name, key string, keyed bool) (*Slot, Result, error) {
	if l.closed.Load() {
		return nil, Pass, ErrClosed
	}
	var p *C.SluiceSlot
	code, err := check(call, C.go_acquire(name, key, cBool(keyed), &p))
	if p == nil {
		return nil, Result(code), err
	}
	slot := &Slot{}
	slot.ptr.Store(p)
	runtime.SetFinalizer(slot, (*Slot).Release)
	return slot, Result(code), err
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// QuotaCount is the number of quotas in the table.
func (l *Limiter) QuotaCount() (int, error) {
	if l.closed.Load() {
		return 0, ErrClosed
	}
	return check("sluice_quota_count", C.go_quota_count())
}

// WaitReady waits until the limiter holds the roots' quota set, at most
// timeout (0: only look; negative: as long as it takes). A limiter started
// with roots has no quotas until its first sync brings them, about one
// sync interval after New: until then a check of a name it does not hold
// is Unknown (passes, uncounted). It returns true once the set is in (at
// once without roots) and false when the time ran out first
// (sluice_wait_ready). It blocks the calling goroutine and its thread.
func (l *Limiter) WaitReady(timeout time.Duration) (bool, error) {
	if l.closed.Load() {
		return false, ErrClosed
	}
	ms := C.uint64_t(^uint64(0))
	if timeout >= 0 {
		ms = C.uint64_t((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	code, err := check("sluice_wait_ready", C.go_wait_ready(ms))
	if err != nil {
		return false, err
	}
	return code == C.SLUICE_PASS, nil
}

// SyncMetrics is the sync thread's state (sluice_sync_metrics_json).
type SyncMetrics struct {
	// Cycles is the number of completed sync cycles.
	Cycles uint64 `json:"cycles"`
	// Ready is true once the limiter holds the roots' quota set (see
	// WaitReady); always true without roots.
	Ready bool `json:"ready"`
	// AllRootsDown is true while no root answers: limits are per host.
	AllRootsDown bool `json:"all_roots_down"`
	// GroupsDown lists the root groups whose shards are limited per host
	// (with root groups only).
	GroupsDown []uint32 `json:"groups_down"`
	// Roots has one entry per configured root, in order.
	Roots []RootMetrics `json:"roots"`
}

// RootMetrics is one root's sync state.
type RootMetrics struct {
	// URL is the root's base URL.
	URL string `json:"url"`
	// Group is the root's group (shard).
	Group uint32 `json:"group"`
	// Up is true when the last sync with this root succeeded.
	Up bool `json:"up"`
	// SinceSuccess is the time since the last successful sync, to the
	// millisecond; Synced is false (and SinceSuccess 0) before the first.
	SinceSuccess time.Duration `json:"-"`
	Synced       bool          `json:"-"`
	// Syncs and Errors count successful and failed syncs.
	Syncs  uint64 `json:"syncs"`
	Errors uint64 `json:"errors"`
	// LastError is the last failure, for humans.
	LastError string `json:"last_error"`
	// RoundTrip is the last sync's round trip, to the microsecond.
	RoundTrip time.Duration `json:"-"`
	// ClockOffset is the root's clock minus this host's, to the
	// microsecond.
	ClockOffset time.Duration `json:"-"`
	// BytesSent and BytesReceived count sync request and response bytes.
	BytesSent     uint64 `json:"bytes_sent"`
	BytesReceived uint64 `json:"bytes_received"`
	// DroppedDeltas counts unsent counts dropped while the root was away.
	DroppedDeltas uint64 `json:"dropped_deltas"`
	// DroppedReturns counts units given back and not sent because the
	// root predates returns (it keeps them).
	DroppedReturns uint64 `json:"dropped_returns"`
}

// UnmarshalJSON reads the library's seconds and milliseconds into
// durations.
func (r *RootMetrics) UnmarshalJSON(data []byte) error {
	type plain RootMetrics
	var raw struct {
		*plain
		LastSuccessSecondsAgo *float64 `json:"last_success_seconds_ago"`
		RoundTripMs           float64  `json:"round_trip_ms"`
		ClockOffsetMs         float64  `json:"clock_offset_ms"`
	}
	raw.plain = (*plain)(r)
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	if raw.LastSuccessSecondsAgo != nil {
		r.Synced = true
		r.SinceSuccess = time.Duration(*raw.LastSuccessSecondsAgo * float64(time.Second))
	}
	r.RoundTrip = time.Duration(raw.RoundTripMs * float64(time.Millisecond))
	r.ClockOffset = time.Duration(raw.ClockOffsetMs * float64(time.Millisecond))
	return nil
}

// SyncMetrics reads the sync thread's state.
func (l *Limiter) SyncMetrics() (*SyncMetrics, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	var out *C.char
	if _, err := check("sluice_sync_metrics_json", C.go_sync_metrics_json(&out)); err != nil {
		return nil, err
	}
	defer C.sluice_free_string(out)
	var m SyncMetrics
	if err := json.Unmarshal([]byte(C.GoString(out)), &m); err != nil {
		return nil, fmt.Errorf("sluice: sync metrics: %w", err)
	}
	return &m, nil
}

// Close stops the limiter (its sync thread). It is idempotent; afterwards
// a new Limiter may be started.
func (l *Limiter) Close() error {
	var err error
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		_, err = check("sluice_shutdown", C.go_shutdown())
	})
	return err
}
