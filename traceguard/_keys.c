/* The launch join's key search (traceguard/model.py, which documents the join and keeps the NumPy
 * version this one must equal): per op key, its lower bound among the launch calls' sorted keys,
 * as np.searchsorted(sorted_keys, keys, side="left") gives it, and whether the key is there.
 *
 * lower_bounds(sorted_keys, keys, shift, at, hit)
 *   sorted_keys int64 (m, ascending); keys int64 (n); shift: the bit where a packed key's process
 *   starts (keys >> shift name the process; -1: all keys one sequence); at writable int64 (n):
 *   each key's lower bound, at most m - 1 (where a key is above every sorted key its bound m is
 *   given as m - 1, as the join clips it; m = 0 gives 0); hit writable uint8 (n): 1 where
 *   sorted_keys[at] equals the key.
 *
 * Each key is searched from the last answer of its process, galloping (steps 1, 2, 4, ... then a
 * binary search between the last two): a process's launches come in correlation-id order, so its
 * next key is near its last one, and a run of equal keys (a graph launch's kernels) is answered
 * at once. NumPy's binary search starts over for each key (22 halvings of a 4 M-call cache, most
 * of them missing the processor's caches: ~60 ms a million ops of the per-op NVTX shape, two
 * processes interleaved). Keys in no order are still answered exactly (a gallop from anywhere
 * ends at the lower bound), at no more than twice a binary search's steps. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Processes remembered at once; a further one takes the slot of its hash (answers stay exact). */
#define SLOTS 64

/* The lower bound of k in s[0..m), searched from a known position p in [0, m]. */
static Py_ssize_t gallop(const int64_t *s, Py_ssize_t m, Py_ssize_t p, int64_t k) {
    Py_ssize_t lo, hi;
    if (p < m && s[p] < k) { /* right of p: s[lo] < k, and s[hi] >= k or hi == m */
        lo = p;
        Py_ssize_t step = 1;
        hi = lo + step;
        while (hi < m && s[hi] < k) {
            lo = hi;
            step <<= 1;
            hi = lo + step;
        }
        if (hi > m) hi = m;
        lo += 1;
    } else { /* at or left of p: s[p] >= k (or p == m); lo - 1 < 0 or s[lo - 1] < k */
        if (p == 0 || s[p - 1] < k) return p;
        hi = p - 1; /* s[hi] >= k */
        Py_ssize_t step = 1, below = hi - step;
        while (below >= 0 && s[below] >= k) {
            hi = below;
            step <<= 1;
            below = hi - step;
        }
        lo = below < 0 ? 0 : below + 1;
    }
    while (lo < hi) { /* the first index in [lo, hi] whose key is >= k (hi qualifies) */
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (s[mid] < k) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* A C-contiguous buffer of `itemsize`-byte items (a float64 or uint8 array of the right byte
   length would otherwise be read as int64). */
static int get(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int integer = f[0] != '\0' && f[1] == '\0' && strchr(itemsize == 8 ? "qlQL" : "bB?", f[0]) != NULL;
    if (view->itemsize != itemsize || !integer) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "lower_bounds: int64 keys and outputs, a uint8 hit output");
        return -1;
    }
    return 0;
}

static PyObject *lower_bounds(PyObject *module, PyObject *args) {
    PyObject *sorted_obj, *keys_obj, *at_obj, *hit_obj;
    int shift;
    (void)module;
    if (!PyArg_ParseTuple(args, "OOiOO", &sorted_obj, &keys_obj, &shift, &at_obj, &hit_obj)) return NULL;
    Py_buffer sorted, keys, at, hit;
    if (get(sorted_obj, &sorted, 0, 8) < 0) return NULL;
    if (get(keys_obj, &keys, 0, 8) < 0) {
        PyBuffer_Release(&sorted);
        return NULL;
    }
    if (get(at_obj, &at, 1, 8) < 0) {
        PyBuffer_Release(&sorted);
        PyBuffer_Release(&keys);
        return NULL;
    }
    if (get(hit_obj, &hit, 1, 1) < 0) {
        PyBuffer_Release(&sorted);
        PyBuffer_Release(&keys);
        PyBuffer_Release(&at);
        return NULL;
    }
    int bad = sorted.len % 8 != 0 || keys.len % 8 != 0 || at.len != keys.len || hit.len * 8 != keys.len ||
              shift < -1 || shift > 62;
    if (bad) {
        PyBuffer_Release(&sorted);
        PyBuffer_Release(&keys);
        PyBuffer_Release(&at);
        PyBuffer_Release(&hit);
        PyErr_SetString(PyExc_ValueError,
                        "lower_bounds: int64 sorted keys, int64 keys, int64 and uint8 outputs of their length, shift -1..62");
        return NULL;
    }
    const int64_t *s = sorted.buf, *k = keys.buf;
    int64_t *a = at.buf;
    uint8_t *h = hit.buf;
    Py_ssize_t m = sorted.len / 8, n = keys.len / 8;
    Py_BEGIN_ALLOW_THREADS
    int64_t slot_process[SLOTS];
    Py_ssize_t slot_at[SLOTS];
    uint8_t used[SLOTS] = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t key = k[i];
        int64_t process = shift < 0 ? 0 : key >> shift;
        unsigned slot = (unsigned)((uint64_t)process * 0x9E3779B97F4A7C15ULL >> 58); /* 64 slots */
        Py_ssize_t from = used[slot] && slot_process[slot] == process ? slot_at[slot] : m / 2;
        Py_ssize_t found = gallop(s, m, from, key);
        used[slot] = 1;
        slot_process[slot] = process;
        slot_at[slot] = found;
        Py_ssize_t clipped = found < m ? found : (m > 0 ? m - 1 : 0);
        a[i] = clipped;
        h[i] = m > 0 && s[clipped] == key;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sorted);
    PyBuffer_Release(&keys);
    PyBuffer_Release(&at);
    PyBuffer_Release(&hit);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"lower_bounds", lower_bounds, METH_VARARGS,
     "Per key, its lower bound among sorted keys (clipped to the last) and whether it is there (model.launch_rows)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_keys", "The launch join's key search (traceguard.model.launch_rows).", -1, methods,
};

PyMODINIT_FUNC PyInit__keys(void) { return PyModule_Create(&module_def); }
