/* The step breakdown's inner loop (traceguard/metrics/breakdown.py, which documents every number
 * and holds the NumPy version this one must equal): one pass over a device's ops in start order
 * keeps three running unions (compute; compute or NCCL; every op) and adds each closed segment,
 * and each idle gap of the last, to the periods it covers. NumPy needs ~30 passes over the ops for
 * the same (≈1 s at 11 M ops on 2 cores); this loop needs one (≈0.05 s).
 *
 * feed(start, end, launch, category, bounds, sums, state)
 *   start, end, launch: int64 buffers of one length (launch -1: unknown), sorted by start;
 *   category: int8 buffer (0 compute, 1 NCCL, 2 copy); bounds: int64 period bounds (P ≥ 2);
 *   sums: writable int64 buffer of 5 × (P − 1) (rows: compute, compute+NCCL, busy, idle host,
 *   idle other); state: writable int64 buffer of 14 (per union: open?, start, end — the busy
 *   union is always open, from the first bound on; then per row of sums the period its last
 *   segment fell in). */
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

static PyObject *feed(PyObject *module, PyObject *args) {
    PyObject *o_start, *o_end, *o_launch, *o_cat, *o_bounds, *o_sums, *o_state;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &o_start, &o_end, &o_launch, &o_cat, &o_bounds, &o_sums, &o_state))
        return NULL;
    Py_buffer vs, ve, vl, vc, vb, vsum, vst;
    Py_buffer *views[7] = {&vs, &ve, &vl, &vc, &vb, &vsum, &vst};
    int got = 0;
    PyObject *objs[7] = {o_start, o_end, o_launch, o_cat, o_bounds, o_sums, o_state};
    for (; got < 7; got++) {
        if (get(objs[got], views[got], got >= 5, "") < 0) goto fail;
    }
    Py_ssize_t n = vs.len / 8;
    Py_ssize_t nb = vb.len / 8;
    if (ve.len / 8 != n || vl.len / 8 != n || vc.len != n || nb < 2 || vsum.len / 8 != 5 * (nb - 1) || vst.len / 8 != 14) {
        PyErr_SetString(PyExc_ValueError, "feed: buffers of mismatched lengths");
        goto fail;
    }
    const int64_t *start = vs.buf, *end = ve.buf, *launch = vl.buf;
    const int8_t *cat = vc.buf;
    int64_t *st = vst.buf;
    Periods p = {vb.buf, nb - 1, vsum.buf, st + 9};
    Py_BEGIN_ALLOW_THREADS
    /* Unions: 0 compute, 1 compute or NCCL, 2 busy (every op). */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = start[i], e = end[i] > s ? end[i] : s;
        int c = cat[i];
        for (int u = 0; u < 3; u++) {
            if ((u == 0 && c != 0) || (u == 1 && c > 1)) continue;
            int64_t *open = st + 3 * u, *us = st + 3 * u + 1, *ue = st + 3 * u + 2;
            if (*open && s <= *ue) {
                if (e > *ue) *ue = e;
                continue;
            }
            if (*open) {
                add(&p, u, *us, *ue);
                if (u == 2) add(&p, launch[i] >= *ue ? 3 : 4, *ue, s); /* the idle gap before this op */
            }
            *open = 1;
            *us = s;
            *ue = e;
        }
    }
    Py_END_ALLOW_THREADS
    for (int k = 0; k < 7; k++) PyBuffer_Release(views[k]);
    Py_RETURN_NONE;
fail:
    for (int k = 0; k < got; k++) PyBuffer_Release(views[k]);
    return NULL;
}

static PyMethodDef methods[] = {
    {"feed", feed, METH_VARARGS, "Feed a device's ops, sorted by start, to the step breakdown's unions."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_breakdown", "The step breakdown's inner loop (traceguard.metrics.breakdown).", -1, methods,
};

PyMODINIT_FUNC PyInit__breakdown(void) { return PyModule_Create(&module_def); }
