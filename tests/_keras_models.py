"""Keras models shared by the parity tests and ``scripts/keras_parity.py`` (no pytest here: the
script runs them in environments without it, against other Keras releases)."""

from __future__ import annotations

from typing import Any, Tuple


def property_models(keras: Any) -> Tuple[type, type]:
    """saving_lib_test's redefinition of a trackable: a model with a ``dense`` layer, and one that
    keeps it as ``a_dense`` and returns it from a ``dense`` property (walked after ``a_dense``)."""

    class NormalModel(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    class WeirdModel(keras.Model):
        def __init__(self):
            super().__init__()
            self.a_dense = keras.layers.Dense(3)

        @property
        def dense(self):
            return self.a_dense

        def call(self, x):
            return self.dense(x)

    return NormalModel, WeirdModel


def rich_model(keras: Any) -> Any:
    """A functional model with a layer of every common kind: Embedding, LSTM, GRU, SimpleRNN,
    MultiHeadAttention, LayerNormalization, BatchNormalization, Dense."""
    inp = keras.Input((6,), dtype="int32")
    x = keras.layers.Embedding(20, 4)(inp)
    x = keras.layers.LSTM(5, return_sequences=True)(x)
    x = keras.layers.GRU(4, return_sequences=True)(x)
    x = keras.layers.SimpleRNN(4, return_sequences=True)(x)
    x = keras.layers.MultiHeadAttention(2, 3)(x, x)
    x = keras.layers.LayerNormalization()(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.BatchNormalization()(x)
    return keras.Model(inp, keras.layers.Dense(2)(x))


def reused_layer_model(keras: Any) -> Any:
    """A functional model that calls one Dense layer twice (keras issue 20307)."""
    inputs = keras.Input((4,))
    reused = keras.layers.Dense(4)
    x = keras.layers.Dense(4)(reused(inputs))
    return keras.Model(inputs, reused(x))


def nested_functional_model(keras: Any) -> Any:
    """A functional model of two functional sub-models, ``func_a`` and ``func_b``."""

    def func(out, name):
        i = keras.Input((4,))
        return keras.Model(i, keras.layers.Dense(out)(i), name=name)

    a, b = keras.Input((4,)), keras.Input((4,))
    return keras.Model([a, b], [func(2, "func_a")(a), func(3, "func_b")(b)])
