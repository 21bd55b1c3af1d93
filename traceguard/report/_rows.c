/* The report's per-step row loops (traceguard.report.rows keeps the Python ones).
 *
 * A rank of the CUDA-graph shape has 68 k step rows of 28 values and two phase dicts each;
 * building the report checks every value's type (is it JSON as it is?) and copies every row
 * into the contract's keys. In Python that is 0.4 s of a 5 s analysis; here it is a walk over
 * the dicts without a Python object made per value.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

/* Whether ``dict`` (depth ``depth`` below the rows: 0 for a row) holds only str keys and plain
 * values: exact int, str, bool, None, finite float, or a dict (itself plain) while depth < 2. */
static int plain_dict(PyObject *dict, int depth) {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) return 0;
        if (value == Py_None || PyLong_CheckExact(value) || PyUnicode_CheckExact(value) || PyBool_Check(value))
            continue;
        if (PyFloat_CheckExact(value)) {
            if (!isfinite(PyFloat_AS_DOUBLE(value))) return 0;
            continue;
        }
        if (PyDict_CheckExact(value)) {
            if (depth >= 2 || !plain_dict(value, depth + 1)) return 0;
            continue;
        }
        return 0;
    }
    return 1;
}

static PyObject *plain_rows(PyObject *self, PyObject *args) {
    PyObject *rows;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &rows)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyDict_CheckExact(row) || !plain_dict(row, 0)) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* [{key: row.get(key, defaults.get(key)) for key in keys} for row in rows]: the rows must be
 * dicts, the keys a tuple of str, the defaults a dict. */
static PyObject *project_rows(PyObject *self, PyObject *args) {
    PyObject *rows, *keys, *defaults;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &rows, &PyTuple_Type, &keys, &PyDict_Type, &defaults))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows), width = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t k = 0; k < width; k++) {
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(keys, k))) {
            PyErr_SetString(PyExc_TypeError, "keys must be str");
            return NULL;
        }
    }
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyDict_Check(row)) {
            PyErr_Format(PyExc_TypeError, "row %zd is not a dict", i);
            Py_DECREF(out);
            return NULL;
        }
        PyObject *made = _PyDict_NewPresized(width);
        if (made == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, made);
        for (Py_ssize_t k = 0; k < width; k++) {
            PyObject *key = PyTuple_GET_ITEM(keys, k);
            PyObject *value = PyDict_GetItemWithError(row, key);
            if (value == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(out);
                    return NULL;
                }
                value = PyDict_GetItemWithError(defaults, key);
                if (value == NULL) {
                    if (PyErr_Occurred()) {
                        Py_DECREF(out);
                        return NULL;
                    }
                    value = Py_None;
                }
            }
            if (PyDict_SetItem(made, key, value) < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
    }
    return out;
}

static PyMethodDef methods[] = {
    {"plain_rows", plain_rows, METH_VARARGS, "Whether every row is JSON as it is (report.rows.plain_rows)."},
    {"project_rows", project_rows, METH_VARARGS, "Each row as a new dict of the given keys (report.rows.project_rows)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_rows", "The report's per-step row loops (traceguard.report.rows).", -1, methods,
};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module_def); }
