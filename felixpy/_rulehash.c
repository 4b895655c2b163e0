/*
 * felixpy._rulehash: Felix's chained rule hashes (the "cali:<hash>" comment), in C.
 *
 * The same function as felixpy/drivers/generictables/hashing.py, which stays the
 * reference and the fallback: h0 = SHA-224(chain name); for rule i,
 * h_i = SHA-224(h_{i-1} || text_i); the hash is the URL-safe, unpadded base64 of the
 * first 12 bytes of h_i (16 characters).  text_i is the rule's text, or, when a head
 * is given, head + " " + body (head alone for an empty body): the iptables backend
 * passes "-A <chain> HASH" and the rendered bodies, so the texts are never built.
 *
 * Why C: a restart hashes every rule of the node (145,000 at the stress profile), and
 * in Python each rule costs a hash object, two byte strings and a digest, ~2 us,
 * most of it interpreter overhead around a ~0.3 us SHA-224 of ~150 bytes.  Here one
 * OpenSSL digest context is reused for the whole chain.  SHA-224 and base64 are
 * OpenSSL's (libcrypto), never written here.
 *
 * The GIL stays held: a chain's digests take microseconds (a 10-rule endpoint chain
 * ~6 us), and a thread that lets the GIL go waits up to the switch interval (5 ms)
 * to get it back whenever another thread is running Python, which would cost the
 * apply far more than any overlap could give.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>
#include <string.h>

#define DIGEST_BYTES 12              /* 12 bytes: exactly 16 base64 characters, no padding */
#define HASH_CHARS 16
#define ASSEMBLY_BYTES 2048          /* a rule's message up to this size is digested in one update */

static EVP_MD *sha224;               /* fetched once at import */

typedef struct {
    const char *data;
    Py_ssize_t len;
} text_t;

/* A str's UTF-8 bytes.  A compact ASCII str is its own UTF-8 (no copy); any other is
 * encoded into a new bytes object put in *owned (never cached on the str, which would
 * keep a second copy alive as long as the body is held).  -1 with an exception set on
 * failure (not a str; unencodable, as str.encode() would raise). */
static int utf8_of(PyObject *s, text_t *out, PyObject **owned) {
    *owned = NULL;
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "rule text must be str, not %.100s", Py_TYPE(s)->tp_name);
        return -1;
    }
    if (PyUnicode_IS_COMPACT_ASCII(s)) {
        out->data = (const char *)PyUnicode_DATA(s);
        out->len = PyUnicode_GET_LENGTH(s);
        return 0;
    }
    PyObject *b = PyUnicode_AsUTF8String(s);
    if (b == NULL)
        return -1;
    *owned = b;
    out->data = PyBytes_AS_STRING(b);
    out->len = PyBytes_GET_SIZE(b);
    return 0;
}

/* One rule's digest: SHA-224 of prev || [head " "] text.  Short messages (nearly all) are
 * assembled in buf and digested in one update: each EVP update costs about as much as
 * hashing 64 bytes. */
static int digest_one(EVP_MD_CTX *ctx, const unsigned char *prev, unsigned int prevlen, const text_t *head,
                      const text_t *text, unsigned char *buf, size_t bufsize, unsigned char *h, unsigned int *hlen) {
    size_t need = prevlen + (head != NULL ? (size_t)head->len + 1 : 0) + (size_t)text->len;
    if (!EVP_DigestInit_ex2(ctx, sha224, NULL))
        return -1;
    if (need <= bufsize) {
        size_t at = prevlen;
        memcpy(buf, prev, prevlen);
        if (head != NULL) {
            memcpy(buf + at, head->data, (size_t)head->len);
            at += (size_t)head->len;
            if (text->len > 0)
                buf[at++] = ' ';
        }
        memcpy(buf + at, text->data, (size_t)text->len);
        at += (size_t)text->len;
        if (!EVP_DigestUpdate(ctx, buf, at))
            return -1;
    } else {
        if (!EVP_DigestUpdate(ctx, prev, prevlen))
            return -1;
        if (head != NULL && (!EVP_DigestUpdate(ctx, head->data, (size_t)head->len) ||
                             (text->len > 0 && !EVP_DigestUpdate(ctx, " ", 1))))
            return -1;
        if (!EVP_DigestUpdate(ctx, text->data, (size_t)text->len))
            return -1;
    }
    return EVP_DigestFinal_ex(ctx, h, hlen) ? 0 : -1;
}

static PyObject *chain_hashes(PyObject *self, PyObject *args) {
    PyObject *name_obj, *head_obj, *seq_obj;
    if (!PyArg_ParseTuple(args, "UOO:chain_hashes", &name_obj, &head_obj, &seq_obj))
        return NULL;
    if (head_obj != Py_None && !PyUnicode_Check(head_obj)) {
        PyErr_SetString(PyExc_TypeError, "head must be str or None");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(seq_obj, "rule texts must be iterable");  /* a list or tuple as is */
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);

    PyObject *hashes = NULL, *name_owned = NULL, *head_owned = NULL;
    text_t name, head;
    unsigned char h[EVP_MAX_MD_SIZE];
    unsigned int hlen = 0;
    unsigned char b64[HASH_CHARS + 1];
    unsigned char buf[ASSEMBLY_BYTES];
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (utf8_of(name_obj, &name, &name_owned) < 0 ||
        (head_obj != Py_None && utf8_of(head_obj, &head, &head_owned) < 0))
        goto fail;
    if ((hashes = PyList_New(n)) == NULL)
        goto fail;
    if (!EVP_DigestInit_ex2(ctx, sha224, NULL) || !EVP_DigestUpdate(ctx, name.data, (size_t)name.len) ||
        !EVP_DigestFinal_ex(ctx, h, &hlen))
        goto openssl_fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        text_t text;
        PyObject *owned;
        if (utf8_of(PySequence_Fast_GET_ITEM(seq, i), &text, &owned) < 0)
            goto fail;
        int rc = digest_one(ctx, h, hlen, head_obj != Py_None ? &head : NULL, &text, buf, sizeof(buf), h, &hlen);
        Py_XDECREF(owned);
        if (rc < 0)
            goto openssl_fail;
        EVP_EncodeBlock(b64, h, DIGEST_BYTES);
        for (int j = 0; j < HASH_CHARS; j++)
            b64[j] = b64[j] == '+' ? '-' : b64[j] == '/' ? '_' : b64[j];
        PyObject *hash = PyUnicode_DecodeASCII((const char *)b64, HASH_CHARS, NULL);
        if (hash == NULL)
            goto fail;
        PyList_SET_ITEM(hashes, i, hash);
    }
    Py_XDECREF(name_owned);
    Py_XDECREF(head_owned);
    Py_DECREF(seq);
    EVP_MD_CTX_free(ctx);
    return hashes;

openssl_fail:
    PyErr_SetString(PyExc_RuntimeError, "OpenSSL SHA-224 failed");
fail:
    Py_XDECREF(hashes);
    Py_XDECREF(name_owned);
    Py_XDECREF(head_owned);
    Py_DECREF(seq);
    EVP_MD_CTX_free(ctx);
    return NULL;
}

static PyMethodDef methods[] = {
    {"chain_hashes", chain_hashes, METH_VARARGS,
     "chain_hashes(chain_name, head, texts) -> list[str]\n\n"
     "Felix's chained rule hashes of one chain: of each text, or with head not None of\n"
     "head + ' ' + text (head alone for an empty text)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "felixpy._rulehash",
    "Felix's chained rule hashes in C (felixpy/drivers/generictables/hashing.py is the reference).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__rulehash(void) {
    if (sha224 == NULL) {
        sha224 = EVP_MD_fetch(NULL, "SHA224", NULL);
        if (sha224 == NULL) {
            PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA224 digest");
            return NULL;
        }
    }
    return PyModule_Create(&module);
}
