/* Compiled decoders of wire records: the C twin of the decoders schema.py generates as Python.
 *
 * schema.py turns each record class's field codecs into a *spec*, nested tuples naming one check per
 * field (Decoder_doc below lists the forms), and builds a Decoder from it once. Calling the
 * Decoder with a wire tuple (as msgpack unpacked it) checks every field exactly as the codecs'
 * Python `check` would, and builds the frozen record without running its __init__: the instance is
 * allocated with its type's tp_alloc (as object.__new__ does) and the field values are stored straight
 * into its slots, found through the slots' member descriptors. NodeId and Digest are built the same way.
 *
 * A refusal raises the `error` class given to the Decoder (InvalidMessage) with a short text and
 * nothing else; schema.py then asks the reference decoder why, so the error a user sees is the same
 * with or without this module. Whatever the Python side can decide only by running Python (a text
 * field's rule, a non-ASCII text, a record's _validate hook, a codec of another kind) is called back.
 * The decoder sees hostile data: every type test is exact (a str subclass is not a str here, as in
 * the Python decoder), every length is bounded before use, and nesting is bounded by the spec, with
 * Py_EnterRecursiveCall guarding records that contain themselves.
 *
 * A text field with a rule may name a *quick* test of its own (Text.native in schema.py), the C twin of
 * the `quick` expression the Python decoder inlines: true only for ASCII texts that keep the rule, so
 * the rule is called only when it is false: a character set (network names), bytes a text may not hold
 * (variable names: no '='), or the shape of a plain relative file name.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030C0000  /* before 3.12 the member types and flags live in structmember.h */
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#define TEXT_READY(x) PyUnicode_READY(x)
#else
#define TEXT_READY(x) 0  /* every str is ready */
#endif

enum kind { K_UINT, K_BOOL, K_TEXT, K_ONEOF, K_BIN, K_ID, K_OPT, K_SEQ, K_SUB, K_CALL };

typedef struct node node;
struct node {
    enum kind kind;
    unsigned long long lo, hi;  /* UINT: value range; TEXT, BIN, SEQ: length range */
    PyObject *obj;        /* TEXT: rule or NULL; ONEOF: frozenset; ID: class; SUB: Decoder; CALL: callable */
    PyObject *check;      /* TEXT: the codec's check, for what the ASCII fast path cannot decide */
    int quick;            /* TEXT: Q_* (what may skip the rule call) */
    unsigned char table[256];  /* TEXT: Q_CHARSET bytes allowed, Q_EXCLUDE bytes refused */
    PyObject *order;      /* SEQ: key callable, or NULL when `offset` says which slot of an item is the key */
    Py_ssize_t offset;    /* ID: offset of the `raw` slot; SEQ: offset of the key slot in each item, or -1 */
    int ordered;          /* SEQ: items must be strictly increasing */
    node *inner;          /* OPT, SEQ */
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;    /* NULL once cleared */
    PyObject *validate;   /* the record's _validate, or NULL */
    PyObject *error;      /* the exception class a refusal raises */
    Py_ssize_t nfields;
    Py_ssize_t *offsets;  /* slot offset of each field */
    node *fields;
} Decoder;

static PyTypeObject Decoder_Type;

#define SMALL_RECORD 24
enum quick { Q_NONE, Q_CHARSET, Q_EXCLUDE, Q_FILE_NAME };

/* ---- refusal ------------------------------------------------------------------------------------ */

static PyObject *
refuse(PyObject *error, const char *why)
{
    PyErr_SetString(error, why);
    return NULL;
}

/* ---- decoding ----------------------------------------------------------------------------------- */

static PyObject *decode_record(Decoder *d, PyObject *wire);

static PyObject *
call_check(PyObject *check, PyObject *x)
{
    PyObject *r = PyObject_CallOneArg(check, x);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    return Py_NewRef(x);
}

/* Whether ASCII text `t` certainly keeps the field's rule (false: the rule decides). Q_FILE_NAME is
 * jobs.py's _QUICK_FILE_NAME: printable, no backslash, no "//" or "/." (so no empty, "." or ".."
 * part), not starting with "/" or ".", not ending with "/". */
static int
quick_ok(const node *n, const unsigned char *t, Py_ssize_t len)
{
    switch (n->quick) {
    case Q_CHARSET:
        for (Py_ssize_t i = 0; i < len; i++)
            if (!n->table[t[i]])
                return 0;
        return 1;
    case Q_EXCLUDE:
        for (Py_ssize_t i = 0; i < len; i++)
            if (n->table[t[i]])
                return 0;
        return 1;
    case Q_FILE_NAME:
        if (len < 1 || t[0] == '/' || t[0] == '.' || t[len - 1] == '/')
            return 0;
        for (Py_ssize_t i = 0; i < len; i++) {
            if (t[i] < 0x20 || t[i] > 0x7e || t[i] == '\\')
                return 0;
            if (t[i] == '/' && i + 1 < len && (t[i + 1] == '/' || t[i + 1] == '.'))
                return 0;
        }
        return 1;
    default:
        return 0;
    }
}

static PyObject *
decode_text(const node *n, PyObject *x)
{
    if (PyUnicode_CheckExact(x)) {
        if (TEXT_READY(x) < 0)
            return NULL;
        /* ASCII: one byte per character, no surrogate; then only length, NUL and the rule are left */
        if (PyUnicode_IS_ASCII(x)) {
            Py_ssize_t len = PyUnicode_GET_LENGTH(x);
            if ((unsigned long long)len >= n->lo && (unsigned long long)len <= n->hi
                    && memchr(PyUnicode_1BYTE_DATA(x), 0, (size_t)len) == NULL) {
                if (n->obj == NULL || quick_ok(n, PyUnicode_1BYTE_DATA(x), len))
                    return Py_NewRef(x);
                PyObject *why = PyObject_CallOneArg(n->obj, x);
                if (why == NULL)
                    return NULL;
                int kept = why == Py_None;
                Py_DECREF(why);
                if (kept)
                    return Py_NewRef(x);
            }
        }
    }
    return call_check(n->check, x);
}

static PyObject *
new_id(const node *n, PyObject *raw)
{
    PyTypeObject *cls = (PyTypeObject *)n->obj;
    PyObject *obj = cls->tp_alloc(cls, 0);
    if (obj == NULL)
        return NULL;
    *(PyObject **)((char *)obj + n->offset) = Py_NewRef(raw);
    return obj;
}

static PyObject *decode_value(const node *n, PyObject *x, PyObject *error);

/* The key an item is ordered by: a slot of the item (borrowed), or the key callable's result (owned). */
static PyObject *
order_key(const node *n, PyObject *item, int *owned)
{
    if (n->order == NULL) {
        *owned = 0;
        return *(PyObject **)((char *)item + n->offset);
    }
    *owned = 1;
    return PyObject_CallOneArg(n->order, item);
}

static PyObject *
decode_seq(const node *n, PyObject *x, PyObject *error)
{
    if (!PyTuple_CheckExact(x))
        return refuse(error, "expected an array");
    Py_ssize_t len = PyTuple_GET_SIZE(x);
    if ((unsigned long long)len < n->lo || (unsigned long long)len > n->hi)
        return refuse(error, "array length out of range");
    const node *inner = n->inner;
    /* items whose value is the wire value itself are checked in place, and the wire tuple kept */
    int same = inner->kind == K_UINT || inner->kind == K_BOOL || inner->kind == K_TEXT
               || inner->kind == K_ONEOF || inner->kind == K_BIN;
    PyObject *out = same ? Py_NewRef(x) : PyTuple_New(len);
    if (out == NULL)
        return NULL;
    PyObject *last = NULL;
    int last_owned = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *item = decode_value(inner, PyTuple_GET_ITEM(x, i), error);
        if (item == NULL)
            goto fail;
        if (same)
            Py_DECREF(item);  /* the wire tuple holds it */
        else
            PyTuple_SET_ITEM(out, i, item);
        if (n->ordered && len > 1) {  /* one item is in order: its key (maybe costly) is not needed */
            int owned;
            PyObject *key = order_key(n, item, &owned);
            if (key == NULL)
                goto fail;
            if (last != NULL) {
                int lt = PyObject_RichCompareBool(last, key, Py_LT);
                if (lt <= 0) {
                    if (owned)
                        Py_DECREF(key);
                    if (lt == 0)
                        PyErr_SetString(error, "items must be sorted and unique");
                    goto fail;
                }
                if (last_owned)
                    Py_DECREF(last);
            }
            last = key;
            last_owned = owned;
        }
    }
    if (last_owned)
        Py_DECREF(last);
    return out;
fail:
    if (last_owned)
        Py_DECREF(last);
    Py_DECREF(out);
    return NULL;
}

static PyObject *
decode_value(const node *n, PyObject *x, PyObject *error)
{
    switch (n->kind) {
    case K_UINT: {
        if (!PyLong_CheckExact(x))
            return refuse(error, "expected an integer");
        unsigned long long v = PyLong_AsUnsignedLongLong(x);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return NULL;
            PyErr_Clear();
            return refuse(error, "integer out of range");
        }
        if (v < n->lo || v > n->hi)
            return refuse(error, "integer out of range");
        return Py_NewRef(x);
    }
    case K_BOOL:
        if (!PyBool_Check(x))
            return refuse(error, "expected a boolean");
        return Py_NewRef(x);
    case K_TEXT:
        return decode_text(n, x);
    case K_ONEOF: {
        if (!PyUnicode_CheckExact(x))
            return refuse(error, "expected text");
        int found = PySet_Contains(n->obj, x);
        if (found < 0)
            return NULL;
        if (!found)
            return refuse(error, "not one of the choices");
        return Py_NewRef(x);
    }
    case K_BIN: {
        if (!PyBytes_CheckExact(x))
            return refuse(error, "expected bin");
        unsigned long long len = (unsigned long long)PyBytes_GET_SIZE(x);
        if (len < n->lo || len > n->hi)
            return refuse(error, "bin length out of range");
        return Py_NewRef(x);
    }
    case K_ID:
        if (!PyBytes_CheckExact(x) || (unsigned long long)PyBytes_GET_SIZE(x) != n->lo)
            return refuse(error, "expected a bin of an id's size");
        return new_id(n, x);
    case K_OPT:
        if (x == Py_None)
            return Py_NewRef(x);
        return decode_value(n->inner, x, error);
    case K_SEQ:
        return decode_seq(n, x, error);
    case K_SUB: {
        if (Py_EnterRecursiveCall(" while decoding a record"))
            return NULL;
        PyObject *r = decode_record((Decoder *)n->obj, x);
        Py_LeaveRecursiveCall();
        return r;
    }
    case K_CALL:
        return PyObject_CallOneArg(n->obj, x);
    }
    PyErr_SetString(PyExc_SystemError, "_recdecode: corrupt spec");
    return NULL;
}

static PyObject *
decode_record(Decoder *d, PyObject *wire)
{
    if (d->cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_recdecode: the decoder is not initialised (or was cleared)");
        return NULL;
    }
    Py_ssize_t n = d->nfields;
    if (!PyTuple_CheckExact(wire) || PyTuple_GET_SIZE(wire) != n)
        return refuse(d->error, "expected an array of the record's fields");
    PyObject *small[SMALL_RECORD];
    PyObject **values = small;
    if (n > SMALL_RECORD) {
        values = PyMem_New(PyObject *, (size_t)n);
        if (values == NULL)
            return PyErr_NoMemory();
    }
    PyObject *obj = NULL;
    Py_ssize_t done = 0;
    for (; done < n; done++) {
        values[done] = decode_value(&d->fields[done], PyTuple_GET_ITEM(wire, done), d->error);
        if (values[done] == NULL)
            goto fail;
    }
    obj = d->cls->tp_alloc(d->cls, 0);
    if (obj == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++)
        *(PyObject **)((char *)obj + d->offsets[i]) = values[i];  /* the object takes the references */
    done = 0;
    if (d->validate != NULL) {
        PyObject *r = PyObject_CallOneArg(d->validate, obj);
        if (r == NULL) {
            Py_CLEAR(obj);
            goto fail;
        }
        Py_DECREF(r);
    }
fail:
    for (Py_ssize_t i = 0; i < done; i++)
        Py_DECREF(values[i]);
    if (values != small)
        PyMem_Free(values);
    return obj;
}

static PyObject *
Decoder_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "a Decoder takes one positional argument: the wire tuple");
        return NULL;
    }
    return decode_record((Decoder *)self, args[0]);
}

/* ---- building a decoder from its spec ----------------------------------------------------------- */

static void
node_clear(node *n)
{
    Py_CLEAR(n->obj);
    Py_CLEAR(n->check);
    Py_CLEAR(n->order);
    if (n->inner != NULL) {
        node_clear(n->inner);
        PyMem_Free(n->inner);
        n->inner = NULL;
    }
}

static int
node_traverse(node *n, visitproc visit, void *arg)
{
    for (; n != NULL; n = n->inner) {
        Py_VISIT(n->obj);
        Py_VISIT(n->check);
        Py_VISIT(n->order);
    }
    return 0;
}

/* The offset of slot `name` that `cls` itself defines, as a writable object slot. */
static Py_ssize_t
slot_offset(PyTypeObject *cls, PyObject *name)
{
    PyObject *descr = PyDict_GetItemWithError(cls->tp_dict, name);
    if (descr == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s has no slot %R", cls->tp_name, name);
        return -1;
    }
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type) || PyDescr_TYPE(descr) != cls) {
        PyErr_Format(PyExc_TypeError, "%s.%U is not a slot of the class itself", cls->tp_name, name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != Py_T_OBJECT_EX || (m->flags & Py_READONLY) || m->offset < (Py_ssize_t)sizeof(PyObject)
            || m->offset + (Py_ssize_t)sizeof(PyObject *) > cls->tp_basicsize) {
        PyErr_Format(PyExc_TypeError, "%s.%U is not a writable object slot", cls->tp_name, name);
        return -1;
    }
    return m->offset;
}

static int
check_record_class(PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "expected a class");
        return -1;
    }
    PyTypeObject *t = (PyTypeObject *)cls;
    if (t->tp_itemsize != 0 || t->tp_alloc == NULL || (t->tp_flags & Py_TPFLAGS_IS_ABSTRACT)) {
        PyErr_Format(PyExc_TypeError, "%s cannot be built by a Decoder", t->tp_name);
        return -1;
    }
    return 0;
}

static int
get_bound(PyObject *v, unsigned long long *out)
{
    if (!PyLong_CheckExact(v)) {
        PyErr_SetString(PyExc_TypeError, "a bound in a spec is an int");
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(v);
    if (*out == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "a bound in a spec is in 0..2**64-1");
        return -1;
    }
    return 0;
}

static int
get_range(PyObject *spec, Py_ssize_t at, node *n)
{
    if (get_bound(PyTuple_GET_ITEM(spec, at), &n->lo) < 0 || get_bound(PyTuple_GET_ITEM(spec, at + 1), &n->hi) < 0)
        return -1;
    if (n->lo > n->hi) {
        PyErr_SetString(PyExc_ValueError, "a range in a spec is empty");
        return -1;
    }
    return 0;
}

static PyObject *
optional(PyObject *v)
{
    return v == Py_None ? NULL : Py_NewRef(v);
}

static int
require_callable(PyObject *v, const char *what)
{
    if (!PyCallable_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s in a spec is callable", what);
        return -1;
    }
    return 0;
}

static int node_build(node *n, PyObject *spec);

static int
build_seq(node *n, PyObject *spec)
{
    /* ("seq", inner, min, max, order): order None, a slot name of the items, or a key callable */
    n->inner = PyMem_Calloc(1, sizeof(node));
    if (n->inner == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (node_build(n->inner, PyTuple_GET_ITEM(spec, 1)) < 0 || get_range(spec, 2, n) < 0)
        return -1;
    PyObject *order = PyTuple_GET_ITEM(spec, 4);
    n->offset = -1;
    if (order == Py_None)
        return 0;
    n->ordered = 1;
    if (!PyUnicode_Check(order)) {
        if (require_callable(order, "an order key") < 0)
            return -1;
        n->order = Py_NewRef(order);
        return 0;
    }
    PyTypeObject *item_cls;
    if (n->inner->kind == K_SUB)
        item_cls = ((Decoder *)n->inner->obj)->cls;
    else if (n->inner->kind == K_ID)
        item_cls = (PyTypeObject *)n->inner->obj;
    else {
        PyErr_SetString(PyExc_TypeError, "an order by slot needs items that are records or ids");
        return -1;
    }
    if (item_cls == NULL) {
        PyErr_SetString(PyExc_ValueError, "the items' decoder was cleared");
        return -1;
    }
    n->offset = slot_offset(item_cls, order);
    if (n->offset < 0)
        return -1;
    if (n->inner->kind == K_SUB) {  /* the key slot must be one the items' decoder fills */
        Decoder *items = (Decoder *)n->inner->obj;
        for (Py_ssize_t i = 0; i < items->nfields; i++)
            if (items->offsets[i] == n->offset)
                return 0;
        PyErr_Format(PyExc_TypeError, "%s.%U is not a field of the items' decoder", item_cls->tp_name, order);
        return -1;
    }
    return 0;
}

/* A text spec's quick test: None, ("charset", allowed), ("exclude", refused) or ("file_name",); the
 * characters are ASCII. */
static int
get_quick(PyObject *q, node *n)
{
    n->quick = Q_NONE;
    memset(n->table, 0, sizeof n->table);
    if (q == Py_None)
        return 0;
    if (!PyTuple_Check(q) || PyTuple_GET_SIZE(q) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(q, 0)))
        goto bad;
    PyObject *form = PyTuple_GET_ITEM(q, 0);
    if (PyUnicode_CompareWithASCIIString(form, "file_name") == 0 && PyTuple_GET_SIZE(q) == 1) {
        n->quick = Q_FILE_NAME;
        return 0;
    }
    int charset = PyUnicode_CompareWithASCIIString(form, "charset") == 0;
    if ((!charset && PyUnicode_CompareWithASCIIString(form, "exclude") != 0) || PyTuple_GET_SIZE(q) != 2)
        goto bad;
    PyObject *chars = PyTuple_GET_ITEM(q, 1);
    if (!PyUnicode_CheckExact(chars) || TEXT_READY(chars) < 0 || !PyUnicode_IS_ASCII(chars))
        goto bad;
    const unsigned char *c = PyUnicode_1BYTE_DATA(chars);
    for (Py_ssize_t i = 0; i < PyUnicode_GET_LENGTH(chars); i++)
        n->table[c[i]] = 1;
    n->quick = charset ? Q_CHARSET : Q_EXCLUDE;
    return 0;
bad:
    PyErr_SetString(PyExc_TypeError, "a text's quick test is None, (\"charset\", ascii), "
                    "(\"exclude\", ascii) or (\"file_name\",)");
    return -1;
}

static int
node_build(node *n, PyObject *spec)
{
    static const struct { const char *name; enum kind kind; Py_ssize_t size; } forms[] = {
        {"uint", K_UINT, 3}, {"bool", K_BOOL, 1}, {"text", K_TEXT, 6}, {"oneof", K_ONEOF, 2},
        {"bin", K_BIN, 3}, {"id", K_ID, 3}, {"opt", K_OPT, 2}, {"seq", K_SEQ, 5}, {"sub", K_SUB, 2},
        {"call", K_CALL, 2},
    };
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0))) {
        PyErr_SetString(PyExc_TypeError, "a field spec is a tuple starting with its form's name");
        return -1;
    }
    PyObject *name = PyTuple_GET_ITEM(spec, 0);
    size_t i = 0;
    for (; i < sizeof(forms) / sizeof(forms[0]); i++)
        if (PyUnicode_CompareWithASCIIString(name, forms[i].name) == 0)
            break;
    if (i == sizeof(forms) / sizeof(forms[0])) {
        PyErr_Format(PyExc_ValueError, "unknown field spec %R", name);
        return -1;
    }
    if (PyTuple_GET_SIZE(spec) != forms[i].size) {
        PyErr_Format(PyExc_TypeError, "a %U spec has %zd items", name, forms[i].size);
        return -1;
    }
    n->kind = forms[i].kind;
    PyObject *a = forms[i].size > 1 ? PyTuple_GET_ITEM(spec, 1) : NULL;
    switch (n->kind) {
    case K_UINT: case K_BIN:
        return get_range(spec, 1, n);
    case K_BOOL:
        return 0;
    case K_TEXT:  /* ("text", min_len, max_bytes, rule or None, check, quick) */
        if (get_range(spec, 1, n) < 0)
            return -1;
        if (PyTuple_GET_ITEM(spec, 3) != Py_None && require_callable(PyTuple_GET_ITEM(spec, 3), "a rule") < 0)
            return -1;
        if (require_callable(PyTuple_GET_ITEM(spec, 4), "a check") < 0)
            return -1;
        n->obj = optional(PyTuple_GET_ITEM(spec, 3));
        n->check = Py_NewRef(PyTuple_GET_ITEM(spec, 4));
        return get_quick(PyTuple_GET_ITEM(spec, 5), n);
    case K_ONEOF:
        if (!PyFrozenSet_CheckExact(a)) {
            PyErr_SetString(PyExc_TypeError, "a oneof spec holds a frozenset");
            return -1;
        }
        n->obj = Py_NewRef(a);
        return 0;
    case K_ID: {  /* ("id", cls, size): an object of cls whose one slot `raw` holds the bytes */
        static PyObject *raw_name = NULL;
        if (check_record_class(a) < 0 || get_bound(PyTuple_GET_ITEM(spec, 2), &n->lo) < 0)
            return -1;
        if (raw_name == NULL && (raw_name = PyUnicode_InternFromString("raw")) == NULL)
            return -1;
        n->offset = slot_offset((PyTypeObject *)a, raw_name);
        if (n->offset < 0)
            return -1;
        n->obj = Py_NewRef(a);
        return 0;
    }
    case K_OPT:
        n->inner = PyMem_Calloc(1, sizeof(node));
        if (n->inner == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        return node_build(n->inner, a);
    case K_SEQ:
        return build_seq(n, spec);
    case K_SUB:
        if (!Py_IS_TYPE(a, &Decoder_Type)) {
            PyErr_SetString(PyExc_TypeError, "a sub spec holds a Decoder");
            return -1;
        }
        n->obj = Py_NewRef(a);
        return 0;
    case K_CALL:
        if (require_callable(a, "a decode function") < 0)
            return -1;
        n->obj = Py_NewRef(a);
        return 0;
    }
    return 0;
}

static int
Decoder_clear(Decoder *d)
{
    if (d->fields != NULL) {
        for (Py_ssize_t i = 0; i < d->nfields; i++)
            node_clear(&d->fields[i]);
        PyMem_Free(d->fields);
        d->fields = NULL;
    }
    PyMem_Free(d->offsets);
    d->offsets = NULL;
    d->nfields = 0;
    Py_CLEAR(d->cls);
    Py_CLEAR(d->validate);
    Py_CLEAR(d->error);
    return 0;
}

static int
Decoder_traverse(Decoder *d, visitproc visit, void *arg)
{
    Py_VISIT(d->cls);
    Py_VISIT(d->validate);
    Py_VISIT(d->error);
    if (d->fields != NULL)
        for (Py_ssize_t i = 0; i < d->nfields; i++)
            if (node_traverse(&d->fields[i], visit, arg) < 0)
                return -1;
    return 0;
}

static void
Decoder_dealloc(Decoder *d)
{
    PyObject_GC_UnTrack(d);
    Decoder_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static int
Decoder_init(Decoder *d, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"cls", "fields", "validate", "error", NULL};
    PyObject *cls, *fields, *validate, *error;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OO:Decoder", keywords, &cls, &PyTuple_Type, &fields,
                                     &validate, &error))
        return -1;
    if (d->cls != NULL) {
        PyErr_SetString(PyExc_TypeError, "a Decoder is initialised once");
        return -1;
    }
    if (check_record_class(cls) < 0)
        return -1;
    if (!PyExceptionClass_Check(error)) {
        PyErr_SetString(PyExc_TypeError, "error is an exception class");
        return -1;
    }
    if (validate != Py_None && require_callable(validate, "validate") < 0)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    d->fields = PyMem_Calloc((size_t)(n ? n : 1), sizeof(node));
    d->offsets = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    if (d->fields == NULL || d->offsets == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    d->nfields = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *field = PyTuple_GET_ITEM(fields, i);
        if (!PyTuple_Check(field) || PyTuple_GET_SIZE(field) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(field, 0))) {
            PyErr_SetString(PyExc_TypeError, "fields is a tuple of (name, spec) pairs");
            goto fail;
        }
        d->offsets[i] = slot_offset((PyTypeObject *)cls, PyTuple_GET_ITEM(field, 0));
        if (d->offsets[i] < 0 || node_build(&d->fields[i], PyTuple_GET_ITEM(field, 1)) < 0)
            goto fail;
        for (Py_ssize_t j = 0; j < i; j++)
            if (d->offsets[j] == d->offsets[i]) {
                PyErr_Format(PyExc_ValueError, "field %U is named twice", PyTuple_GET_ITEM(field, 0));
                goto fail;
            }
    }
    d->cls = (PyTypeObject *)Py_NewRef(cls);
    d->validate = optional(validate);
    d->error = Py_NewRef(error);
    return 0;
fail:
    Decoder_clear(d);
    return -1;
}

static PyObject *
Decoder_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Decoder *d = (Decoder *)type->tp_alloc(type, 0);
    if (d != NULL)
        d->vectorcall = Decoder_vectorcall;
    return (PyObject *)d;
}

static PyObject *
Decoder_repr(Decoder *d)
{
    if (d->cls == NULL)
        return PyUnicode_FromString("<Decoder (cleared)>");
    return PyUnicode_FromFormat("<Decoder of %s>", d->cls->tp_name);
}

static PyObject *
Decoder_get_cls(Decoder *d, void *closure)
{
    if (d->cls == NULL)
        Py_RETURN_NONE;
    return Py_NewRef((PyObject *)d->cls);
}

static PyGetSetDef Decoder_getset[] = {
    {"cls", (getter)Decoder_get_cls, NULL, "The record class this decoder builds.", NULL},
    {NULL},
};

PyDoc_STRVAR(Decoder_doc,
"Decoder(cls, fields, validate, error)\n--\n\n"
"A compiled decoder of the wire tuples of record class `cls`.\n\n"
"`fields` is a tuple of (slot name, spec) pairs in wire order; a spec is one of\n"
"(\"uint\", min, max), (\"bool\",), (\"text\", min_len, max_bytes, rule or None, check, quick),\n"
"(\"oneof\", frozenset), (\"bin\", min_len, max_len), (\"id\", cls, size), (\"opt\", spec),\n"
"(\"seq\", spec, min_items, max_items, None | slot name of the items | key callable),\n"
"(\"sub\", Decoder), (\"call\", decode callable).\n"
"`validate` (or None) is called with each built record; a refusal raises `error`.");

static PyTypeObject Decoder_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "e31.protocol._recdecode.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = Decoder_doc,
    .tp_new = Decoder_new,
    .tp_init = (initproc)Decoder_init,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_traverse = (traverseproc)Decoder_traverse,
    .tp_clear = (inquiry)Decoder_clear,
    .tp_repr = (reprfunc)Decoder_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Decoder, vectorcall),
    .tp_getset = Decoder_getset,
};

/* ---- module ------------------------------------------------------------------------------------- */

PyDoc_STRVAR(module_doc,
"Compiled record decoders for e31.protocol.schema (optional: without this module the generated\n"
"Python decoders run). DISABLED is true when the environment variable E31_PURE_PYTHON is set\n"
"(non-empty) at import: schema.py then keeps to the Python decoders.");

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "e31.protocol._recdecode",
    .m_doc = module_doc,
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__recdecode(void)
{
    if (PyType_Ready(&Decoder_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    const char *pure = getenv("E31_PURE_PYTHON");
    if (PyModule_AddObjectRef(m, "Decoder", (PyObject *)&Decoder_Type) < 0
            || PyModule_AddObjectRef(m, "DISABLED", (pure != NULL && *pure) ? Py_True : Py_False) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
