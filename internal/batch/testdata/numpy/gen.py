# Regenerates the numpy fixtures in this folder: python3 gen.py (numpy >= 1.17).
import numpy as np
from numpy.lib import format as fmt

np.save('f4_c.npy', np.arange(6, dtype='<f4').reshape(2, 3) / 4)
np.save('i2_be_fortran.npy', np.asfortranarray(np.arange(24, dtype='>i2').reshape(2, 3, 4) - 5))
with open('f8_v2.npy', 'wb') as f:
    fmt.write_array(f, np.arange(5, dtype='<f8') * 1.5, version=(2, 0))
with open('u1_v3.npy', 'wb') as f:
    fmt.write_array(f, np.arange(4, dtype='u1').reshape(2, 2), version=(3, 0))
np.save('b1.npy', np.array([True, False, True]))
np.save('f2_scalar.npy', np.float16(2.5))
np.save('f4_empty.npy', np.zeros((0, 3), dtype='f4'))
np.savez('stored.npz', x=np.arange(3, dtype='f4'), mask=np.array([1, 0, 1], dtype='i8'))
np.savez_compressed('deflated.npz', np.arange(4, dtype='i4'), np.ones((2, 2), dtype='f8'))
np.save('c8.npy', np.zeros(2, dtype='c8'))
