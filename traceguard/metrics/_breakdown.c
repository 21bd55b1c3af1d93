/* The step breakdown's inner loop (traceguard/metrics/breakdown.py, which documents every number
 * and holds the NumPy version this one must equal): one pass over a device's ops in start order
 * keeps three running unions (compute; compute or NCCL; every op) and adds each closed segment,
 * and each idle gap of the last, to the periods it covers. NumPy needs ~30 passes over the ops for
 * the same (≈1 s at 11 M ops on 2 cores); this loop needs one (≈0.05 s).
 *
 * feed(start, end, launch, category, runs, bounds, sums, state)
 *   start, end, launch: int64 buffers of one length (launch -1: unknown), in sorted runs;
 *   runs: int64 bounds of those runs (0, ..., n), merged by start here;
 *   category: int8 buffer (0 compute, 1 NCCL, 2 copy); bounds: int64 period bounds (P ≥ 2);
 *   sums: writable int64 buffer of 5 × (P − 1) (rows: compute, compute+NCCL, busy, idle host,
 *   idle other); state: writable int64 buffer of 14 (per union: open?, start, end — the busy
 *   union is always open, from the first bound on; then per row of sums the period its last
 *   segment fell in).
 *
 * contain(points, valid, codes, point_code, keys, order, iend, icode, low, width, out)
 *   traceguard.metrics.intervals.containing_rows's search (which documents the rule and keeps the
 *   NumPy version this one must equal), one pass instead of ~15 NumPy passes over the points:
 *   points int64 (n); valid uint8 (n, 0: null point or key) or None; codes int64 (n) the points'
 *   group codes, or None with point_code for all; keys int64 (m) sorted, code × width + start −
 *   low; order int64 (m) the interval row of each key; iend, icode int64 (m) per interval row;
 *   out writable int64 (n): the row, or -1.
 *
 * group_union(keys, start, end, order, prior_keys, prior_reach, clip, uniq, added, reach, at)
 *   traceguard.metrics.sliced.GroupUnion.feed's per-row sums (which documents the rule and keeps
 *   the NumPy version this one must equal), one pass through ``order`` (the rows' indices in
 *   (key, start) order) instead of ~20 NumPy passes: keys, start, end, order int64 (n);
 *   prior_keys int64 (p, sorted) and prior_reach int64 (p): the groups seen before; clip 0/1;
 *   uniq, added, reach, at writable int64 (n): per group of this chunk, in key order, its key, the
 *   length it adds, its new reach and its index in prior_keys (-1: new). Returns the group count.
 *   order None: the rows are in (key, start) order as they come.
 *
 * in_key_order(keys, start, order)
 *   traceguard.metrics.sliced._in_key_order (which keeps the NumPy version this one must equal):
 *   whether the rows, taken through ``order`` (int64 indices, or None: as they come), are in
 *   (key, start) order, keys int64 and start int64 of one length. One pass and no temporaries,
 *   where NumPy's makes five arrays (≈8 ms a million rows, more than the sort it may spare).
 *
 * align(names, itemsize, mark, target, lo, hi, length, differs)
 *   traceguard.metrics.step_inference._align (which documents the rule and keeps the NumPy
 *   version this one must equal) for a sequence of int32 or int64 names (``itemsize`` 4 or 8):
 *   the position in [lo, hi) whose next ``length`` names best repeat those at ``mark`` (where
 *   the name at ``mark`` recurs, among those positions only), nearest ``target`` among equals,
 *   the first of two equally near. One pass, none of NumPy's per-call arrays: the base shape's
 *   5.6 k boundaries took 22 µs each. None where the arguments lie outside what its callers
 *   pass (the NumPy version then answers).
 *
 * running_max(values, out)
 *   traceguard.metrics.step_inference.running_max (which keeps the NumPy version this one must
 *   equal): out[i] = max(values[0..i]), int64 buffers of one length. NumPy's maximum.accumulate
 *   runs one element at a time through its generic loop (≈8 ns each); this loop ≈1 ns. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    const int64_t *bounds;
    Py_ssize_t periods; /* P - 1 */
    int64_t *sums;
    int64_t *cursor; /* per row: the period of its last segment (each row's segments come in order) */
} Periods;

/* Add [s, e) to row `row` of sums, clipped to each period it covers. */
static void add(const Periods *p, int row, int64_t s, int64_t e) {
    const int64_t *b = p->bounds;
    Py_ssize_t n = p->periods;
    if (e <= s || e <= b[0] || s >= b[n]) return;
    if (s < b[0]) s = b[0];
    if (e > b[n]) e = b[n];
    /* The period holding s, from the row's cursor: a row's segments come in start order. */
    Py_ssize_t lo = (Py_ssize_t)p->cursor[row];
    if (lo < 0 || lo >= n || b[lo] > s) lo = 0;
    while (lo + 1 < n && b[lo + 1] <= s) lo++;
    p->cursor[row] = lo;
    int64_t *out = p->sums + (Py_ssize_t)row * n;
    for (Py_ssize_t k = lo; k < n && s < e; k++) {
        int64_t stop = e < b[k + 1] ? e : b[k + 1];
        if (stop > s) out[k] += stop - s;
        s = stop;
    }
}

static int get(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    (void)what;
    return 0;
}

/* One op, in start order, into the three unions. */
static inline void step(const Periods *p, int64_t *st, int64_t s, int64_t e, int64_t launch, int c) {
    if (e < s) e = s;
    for (int u = 0; u < 3; u++) {
        if ((u == 0 && c != 0) || (u == 1 && c > 1)) continue;
        int64_t *open = st + 3 * u, *us = st + 3 * u + 1, *ue = st + 3 * u + 2;
        if (*open && s <= *ue) {
            if (e > *ue) *ue = e;
            continue;
        }
        if (*open) {
            add(p, u, *us, *ue);
            if (u == 2) add(p, launch >= *ue ? 3 : 4, *ue, s); /* the idle gap before this op */
        }
        *open = 1;
        *us = s;
        *ue = e;
    }
}

#define MAX_RUNS 64

/* feed(start, end, launch, category, runs, bounds, sums, state): ``runs`` (int64) are the bounds
 * of the buffers' sorted runs ([0, ..., n]; a capture's ops come as one sorted block per table),
 * merged here by start as they are read, so that no sorted copy is made. */
static PyObject *feed(PyObject *module, PyObject *args) {
    PyObject *objs[8];
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                          &objs[7]))
        return NULL;
    Py_buffer views[8];
    int got = 0;
    for (; got < 8; got++) {
        if (get(objs[got], &views[got], got >= 6, "") < 0) goto fail;
    }
    Py_ssize_t n = views[0].len / 8, nruns = views[4].len / 8 - 1, nb = views[5].len / 8;
    if (views[1].len / 8 != n || views[2].len / 8 != n || views[3].len != n || nb < 2 || nruns < 1 ||
        nruns > MAX_RUNS || views[6].len / 8 != 5 * (nb - 1) || views[7].len / 8 != 14) {
        PyErr_SetString(PyExc_ValueError, "feed: buffers of mismatched lengths");
        goto fail;
    }
    const int64_t *start = views[0].buf, *end = views[1].buf, *launch = views[2].buf, *runs = views[4].buf;
    const int8_t *cat = views[3].buf;
    int64_t *st = views[7].buf;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        if (runs[r] < 0 || runs[r + 1] < runs[r] || runs[r + 1] > n) {
            PyErr_SetString(PyExc_ValueError, "feed: runs out of range");
            goto fail;
        }
    }
    Periods p = {views[5].buf, nb - 1, views[6].buf, st + 9};
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t at[MAX_RUNS];
    for (Py_ssize_t r = 0; r < nruns; r++) at[r] = runs[r];
    if (nruns == 1) {
        for (Py_ssize_t i = 0; i < n; i++) step(&p, st, start[i], end[i], launch[i], cat[i]);
    } else {
        for (;;) { /* k-way merge: the run whose next op starts first (few runs: a linear scan) */
            Py_ssize_t best = -1;
            for (Py_ssize_t r = 0; r < nruns; r++)
                if (at[r] < runs[r + 1] && (best < 0 || start[at[r]] < start[at[best]])) best = r;
            if (best < 0) break;
            Py_ssize_t i = at[best]++;
            step(&p, st, start[i], end[i], launch[i], cat[i]);
        }
    }
    Py_END_ALLOW_THREADS
    for (int k = 0; k < 8; k++) PyBuffer_Release(&views[k]);
    Py_RETURN_NONE;
fail:
    for (int k = 0; k < got; k++) PyBuffer_Release(&views[k]);
    return NULL;
}

static PyObject *contain(PyObject *module, PyObject *args) {
    PyObject *objs[9];
    long long point_code, low, width;
    (void)module;
    if (!PyArg_ParseTuple(args, "OOOLOOOOLLO", &objs[0], &objs[1], &objs[2], &point_code, &objs[3], &objs[4],
                          &objs[5], &objs[6], &low, &width, &objs[7]))
        return NULL;
    /* objs: 0 points, 1 valid | None, 2 codes | None, 3 keys, 4 order, 5 iend, 6 icode, 7 out */
    Py_buffer views[8];
    int held[8] = {0};
    int ok = 0;
    for (int k = 0; k < 8; k++) {
        if ((k == 1 || k == 2) && objs[k] == Py_None) continue;
        if (get(objs[k], &views[k], k == 7, "") < 0) goto done;
        held[k] = 1;
    }
    Py_ssize_t n = views[0].len / 8, m = views[3].len / 8;
    if ((held[1] && views[1].len != n) || (held[2] && views[2].len / 8 != n) || views[4].len / 8 != m ||
        views[7].len / 8 != n || width < 1) {
        PyErr_SetString(PyExc_ValueError, "contain: buffers of mismatched lengths");
        goto done;
    }
    const int64_t *points = views[0].buf, *keys = views[3].buf, *order = views[4].buf;
    const int64_t *iend = views[5].buf, *icode = views[6].buf;
    const uint8_t *valid = held[1] ? views[1].buf : NULL;
    const int64_t *codes = held[2] ? views[2].buf : NULL;
    Py_ssize_t rows = views[5].len / 8;
    if (views[6].len / 8 != rows) {
        PyErr_SetString(PyExc_ValueError, "contain: buffers of mismatched lengths");
        goto done;
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        if (order[j] < 0 || order[j] >= rows) {
            PyErr_SetString(PyExc_ValueError, "contain: order out of range");
            goto done;
        }
    }
    int64_t *out = views[7].buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t last = 0; /* the previous point's answer + 1: points come nearly in order (launches) */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (valid != NULL && !valid[i]) {
            out[i] = -1;
            continue;
        }
        int64_t code = codes != NULL ? codes[i] : (int64_t)point_code;
        int64_t p = points[i];
        int64_t key = code * (int64_t)width + (p - (int64_t)low);
        Py_ssize_t lo, hi; /* lo: the first key > key */
        if (last > 0 && keys[last - 1] <= key && (last == m || key < keys[last])) {
            lo = last; /* where the previous point was */
        } else if (last < m && keys[last] <= key && (last + 1 == m || key < keys[last + 1])) {
            lo = last + 1; /* the next interval */
        } else {
            lo = 0;
            hi = m;
            while (lo < hi) {
                Py_ssize_t mid = lo + (hi - lo) / 2;
                if (keys[mid] <= key) lo = mid + 1;
                else hi = mid;
            }
        }
        last = lo;
        if (lo == 0) {
            out[i] = -1;
            continue;
        }
        int64_t row = order[lo - 1];
        out[i] = (p <= iend[row] && icode[row] == code) ? row : -1;
    }
    Py_END_ALLOW_THREADS
    ok = 1;
done:
    for (int k = 0; k < 8; k++)
        if (held[k]) PyBuffer_Release(&views[k]);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *group_union(PyObject *module, PyObject *args) {
    PyObject *objs[10];
    int clip;
    (void)module;
    if (!PyArg_ParseTuple(args, "OOOOOOpOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &clip,
                          &objs[6], &objs[7], &objs[8], &objs[9]))
        return NULL;
    Py_buffer views[10];
    int got = 0, ordered = objs[3] == Py_None; /* None: the rows' own order */
    for (; got < 10; got++) {
        if (got == 3 && ordered) continue; /* no view taken: none released below */
        if (get(objs[got], &views[got], got >= 6, "") < 0) goto fail;
    }
    Py_ssize_t n = views[0].len / 8, np_ = views[4].len / 8;
    int sizes_ok = views[1].len / 8 == n && views[2].len / 8 == n && (ordered || views[3].len / 8 == n) &&
                   views[5].len / 8 == np_;
    for (int k = 6; k < 10; k++) sizes_ok = sizes_ok && views[k].len / 8 == n;
    if (!sizes_ok) {
        PyErr_SetString(PyExc_ValueError, "group_union: buffers of mismatched lengths");
        goto fail;
    }
    const int64_t *keys = views[0].buf, *start = views[1].buf, *end = views[2].buf;
    const int64_t *order = ordered ? NULL : views[3].buf;
    const int64_t *pkeys = views[4].buf, *preach = views[5].buf;
    int64_t *uniq = views[6].buf, *added = views[7].buf, *reach = views[8].buf, *at = views[9].buf;
    for (Py_ssize_t i = 0; order != NULL && i < n; i++) {
        if (order[i] < 0 || order[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "group_union: order out of range");
            goto fail;
        }
    }
    Py_ssize_t groups = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t running = 0, total = 0;
    Py_ssize_t lo = 0; /* prior_keys searched from here on: groups come in key order */
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = order != NULL ? order[j] : j;
        int64_t k = keys[i], s = start[i], e = end[i], before;
        if (j == 0 || k != uniq[groups - 1]) {
            if (j > 0) {
                added[groups - 1] = total;
                reach[groups - 1] = running;
            }
            Py_ssize_t a = lo, b = np_;
            while (a < b) {
                Py_ssize_t mid = a + (b - a) / 2;
                if (pkeys[mid] < k) a = mid + 1;
                else b = mid;
            }
            lo = a;
            int known = a < np_ && pkeys[a] == k;
            at[groups] = known ? a : -1;
            uniq[groups++] = k;
            running = known ? preach[a] : INT64_MIN;
            total = 0;
        }
        before = running > s ? running : s; /* max(R[i-1], start) */
        if (e > running) running = e;
        int64_t row = running - before;
        if (clip && row < 0) row = 0;
        total += row;
    }
    if (groups > 0) {
        added[groups - 1] = total;
        reach[groups - 1] = running;
    }
    Py_END_ALLOW_THREADS
    for (int k = 0; k < 10; k++)
        if (k != 3 || !ordered) PyBuffer_Release(&views[k]);
    return PyLong_FromSsize_t(groups);
fail:
    for (int k = 0; k < got; k++)
        if (k != 3 || !ordered) PyBuffer_Release(&views[k]);
    return NULL;
}

static PyObject *in_key_order(PyObject *module, PyObject *args) {
    PyObject *keys_obj, *start_obj, *order_obj;
    (void)module;
    if (!PyArg_ParseTuple(args, "OOO", &keys_obj, &start_obj, &order_obj)) return NULL;
    Py_buffer views[3];
    int got = 0, through = order_obj != Py_None;
    PyObject *objs[3] = {keys_obj, start_obj, order_obj};
    for (; got < (through ? 3 : 2); got++) {
        if (get(objs[got], &views[got], 0, "") < 0) goto fail;
    }
    Py_ssize_t n = views[0].len / 8;
    if (views[0].len % 8 != 0 || views[1].len != views[0].len || (through && views[2].len != views[0].len)) {
        PyErr_SetString(PyExc_ValueError, "in_key_order: int64 buffers of one length expected");
        goto fail;
    }
    const int64_t *keys = views[0].buf, *start = views[1].buf, *order = through ? views[2].buf : NULL;
    for (Py_ssize_t i = 0; order != NULL && i < n; i++) {
        if (order[i] < 0 || order[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "in_key_order: order out of range");
            goto fail;
        }
    }
    int in_order = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 1; j < n; j++) {
        Py_ssize_t a = order != NULL ? order[j - 1] : j - 1, b = order != NULL ? order[j] : j;
        if (keys[b] < keys[a] || (keys[b] == keys[a] && start[b] < start[a])) {
            in_order = 0;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    for (int k = 0; k < got; k++) PyBuffer_Release(&views[k]);
    return PyBool_FromLong(in_order);
fail:
    for (int k = 0; k < got; k++) PyBuffer_Release(&views[k]);
    return NULL;
}

static inline int64_t name_at(const char *names, int itemsize, Py_ssize_t i) {
    return itemsize == 4 ? (int64_t)((const int32_t *)names)[i] : ((const int64_t *)names)[i];
}

static PyObject *align(PyObject *module, PyObject *args) {
    PyObject *names_obj;
    int itemsize, differs;
    Py_ssize_t mark, target, lo, hi, length;
    (void)module;
    if (!PyArg_ParseTuple(args, "Oinnnnnp", &names_obj, &itemsize, &mark, &target, &lo, &hi, &length, &differs))
        return NULL;
    Py_buffer view;
    if (get(names_obj, &view, 0, "") < 0) return NULL;
    Py_ssize_t n = (itemsize == 4 || itemsize == 8) && view.len % itemsize == 0 ? view.len / itemsize : -1;
    /* Outside what the callers pass (names read past either end): the NumPy version's answer. */
    if (n < 0 || length < 0 || mark < 0 || mark + length > n || lo < 0 || target < 0) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    const char *names = view.buf;
    Py_ssize_t best = -1;
    Py_BEGIN_ALLOW_THREADS
    int repeats = 0;
    if (!differs) {
        repeats = target + length > n;
        if (!repeats) {
            repeats = 1;
            for (Py_ssize_t k = 0; k < length && repeats; k++)
                repeats = name_at(names, itemsize, target + k) == name_at(names, itemsize, mark + k);
        }
    }
    if (repeats) {
        best = target;
    } else {
        Py_ssize_t end = hi < n - length + 1 ? hi : n - length + 1;
        int64_t first = name_at(names, itemsize, mark);
        int recurs = 0;
        for (Py_ssize_t c = lo; c < end && !recurs; c++) recurs = name_at(names, itemsize, c) == first;
        Py_ssize_t best_score = -1, best_distance = 0;
        for (Py_ssize_t c = lo; c < end; c++) {
            if (recurs && name_at(names, itemsize, c) != first) continue;
            Py_ssize_t score = 0;
            for (Py_ssize_t k = 0; k < length; k++)
                score += name_at(names, itemsize, c + k) == name_at(names, itemsize, mark + k);
            Py_ssize_t distance = c > target ? c - target : target - c;
            if (score > best_score || (score == best_score && distance < best_distance)) {
                best = c;
                best_score = score;
                best_distance = distance;
            }
        }
        if (best < 0) best = target;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(best);
}

static PyObject *running_max(PyObject *module, PyObject *args) {
    PyObject *values_obj, *out_obj;
    (void)module;
    if (!PyArg_ParseTuple(args, "OO", &values_obj, &out_obj)) return NULL;
    Py_buffer values, out;
    if (get(values_obj, &values, 0, "") < 0) return NULL;
    if (get(out_obj, &out, 1, "") < 0) {
        PyBuffer_Release(&values);
        return NULL;
    }
    if (values.len != out.len || values.len % 8 != 0) {
        PyBuffer_Release(&values);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "running_max: int64 buffers of one length expected");
        return NULL;
    }
    Py_ssize_t n = values.len / 8;
    const int64_t *v = values.buf;
    int64_t *o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    int64_t high = INT64_MIN;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (v[i] > high) high = v[i];
        o[i] = high;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&values);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* [dict(zip(keys, values)) for values in zip(*columns)]: the keys a tuple of str, the columns
 * lists of one length (rows.dicts_from_columns). */
static PyObject *dicts_from_columns(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *keys, *columns;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &keys, &PyTuple_Type, &columns)) return NULL;
    Py_ssize_t width = PyTuple_GET_SIZE(keys);
    if (PyTuple_GET_SIZE(columns) != width) {
        PyErr_SetString(PyExc_ValueError, "dicts_from_columns: a column per key expected");
        return NULL;
    }
    Py_ssize_t n = -1;
    for (Py_ssize_t k = 0; k < width; k++) {
        PyObject *column = PyTuple_GET_ITEM(columns, k);
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(keys, k)) || !PyList_CheckExact(column)) {
            PyErr_SetString(PyExc_TypeError, "dicts_from_columns: str keys and list columns expected");
            return NULL;
        }
        if (n >= 0 && PyList_GET_SIZE(column) != n) {
            PyErr_SetString(PyExc_ValueError, "dicts_from_columns: columns of one length expected");
            return NULL;
        }
        n = PyList_GET_SIZE(column);
    }
    if (n < 0) n = 0;
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = _PyDict_NewPresized(width);
        if (row == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, row);
        for (Py_ssize_t k = 0; k < width; k++) {
            if (PyDict_SetItem(row, PyTuple_GET_ITEM(keys, k), PyList_GET_ITEM(PyTuple_GET_ITEM(columns, k), i)) < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
    }
    return out;
}

static PyMethodDef methods[] = {
    {"feed", feed, METH_VARARGS, "Feed a device's ops, sorted by start, to the step breakdown's unions."},
    {"contain", contain, METH_VARARGS, "Per point, the row of the interval that contains it (intervals.containing_rows)."},
    {"group_union", group_union, METH_VARARGS, "Per group, the union length a chunk adds (sliced.GroupUnion.feed)."},
    {"in_key_order", in_key_order, METH_VARARGS, "Whether rows are in (key, start) order (sliced._in_key_order)."},
    {"align", align, METH_VARARGS, "The next iteration's first kernel (step_inference._align)."},
    {"running_max", running_max, METH_VARARGS, "Running maximum of int64 values (step_inference.running_max)."},
    {"dicts_from_columns", dicts_from_columns, METH_VARARGS, "A dict per row from columns (intervals.dicts_from_columns)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_breakdown", "The step breakdown's inner loop (traceguard.metrics.breakdown).", -1, methods,
};

PyMODINIT_FUNC PyInit__breakdown(void) { return PyModule_Create(&module_def); }
