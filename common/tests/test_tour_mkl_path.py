"""The tour's first timing line names the code path of torch's float32 GEMM from MKL's
MKL_VERBOSE banner: on any CPU, whatever MKL calls it, and never 'another BLAS?' where MKL
printed its banner."""

import pytest

from eml.common import tour

# The banner on the AMD EPYC machines measured (oneMKL 2024.0, MKL_VERBOSE=1, one 64 x 64 torch.mm).
AMD = ("MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture "
       "Intel(R) Architecture processors, Lnx 2.45GHz lp64 gnu_thread\n"
       "MKL_VERBOSE SGEMM(N,N,64,64,64,0x7ffd90d56ca0,0x562d33b7ca40,64,0x562d33b76c00,64,0x7ffd90d56cc0,"
       "0x562d33b80ac0,64) 16.36ms CNR:OFF Dyn:1 FastMM:1 TID:0  NThr:2\n")
# An Intel Xeon's, the AVX-512 path, as MKL names it there up to "Deep Learning Boost"; the rest
# of the name is made up to hold commas, as MKL's longer names do: they must not cut it.
XEON = ("MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture "
        "Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with support of Intel(R) Deep Learning "
        "Boost (Intel(R) DL Boost), EVEX-encoded AES and Carry-Less Multiplication Quadword instructions, "
        "Lnx 2.10GHz lp64 gnu_thread\n"
        "MKL_VERBOSE SGEMM(N,N,64,64,64,0x7ffc,0x55d0,64,0x55d1,64,0x7ffd,0x55d2,64) 9.21ms CNR:OFF Dyn:1 "
        "FastMM:1 TID:0  NThr:2\n")
# An AVX2 Intel CPU's, as Intel MKL 2019 printed it.
AVX2 = ("MKL_VERBOSE Intel(R) MKL 2019.0 Update 1 Product build 20181227 for Intel(R) 64 architecture "
        "Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors, Lnx 2.00GHz lp64 intel_thread\n")


@pytest.mark.parametrize("banner, path", [
    (AMD, "Intel(R) 64 architecture Intel(R) Architecture processors"),
    (XEON, "Intel(R) 64 architecture Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with support of "
           "Intel(R) Deep Learning Boost (Intel(R) DL Boost), EVEX-encoded AES and Carry-Less Multiplication "
           "Quadword instructions"),
    (AVX2, "Intel(R) 64 architecture Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors"),
], ids=["amd-generic", "xeon-avx512", "intel-avx2"])
def test_the_code_path_is_read_from_the_banner(banner, path):
    assert tour.mkl_code_path(banner) == path


@pytest.mark.parametrize("output", ["", "OpenBLAS 0.3.27 DYNAMIC_ARCH\n",
                                    "MKL_VERBOSE SGEMM(N,N,64,64,64,0x1,0x2,64,0x3,64,0x4,0x5,64) 1.0ms\n"],
                         ids=["nothing", "another-blas", "calls-without-banner"])
def test_no_banner_is_no_code_path(output):
    assert tour.mkl_code_path(output) is None
