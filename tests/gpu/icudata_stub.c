/* An ICU data library with no data, for the GPU run kit (make_kit.sh):
 * Debian's libicudata (31 MB) holds the locale, collation, conversion and
 * NFKC tables; the kit's processes only normalise to NFC/NFD, whose tables
 * libicuuc carries itself (ICU's hard-coded NFC data), or not at all. It
 * is ICU's own stubdata (icu4c/source/stubdata/stubdata.cpp): a data header
 * with an empty table of contents, exported as icudt<major>_dat. With it,
 * everything that needs loaded data (e.g. the NFKC normaliser) fails with
 * an ICU error status rather than silently: text/normalizer.cc returns
 * that error. Build: cc -shared -fPIC -DICUDT_SYMBOL=icudt72_dat
 * -Wl,-soname,libicudata.so.72. */
#include <stdint.h>

#ifndef ICUDT_SYMBOL
#error "define ICUDT_SYMBOL, e.g. icudt72_dat"
#endif

struct IcuDataHeader {
  uint16_t header_size; /* MappedData */
  uint8_t magic1, magic2;
  uint16_t info_size; /* UDataInfo */
  uint16_t reserved_word;
  uint8_t is_big_endian, charset_family, sizeof_uchar, reserved_byte;
  uint8_t data_format[4], format_version[4], data_version[4];
  char padding[8];
  uint32_t count, reserved;
  struct {
    const char* entry_name;
    const void* data;
  } toc[1];
};

__attribute__((visibility("default"))) const struct IcuDataHeader ICUDT_SYMBOL = {
    32,   0xda, 0x27, /* header size, magic */
    20,   0,          /* sizeof(UDataInfo), reserved */
    0,    0,    2, 0, /* little endian, ASCII family, sizeof(UChar), reserved */
    {0x54, 0x6f, 0x43, 0x50}, /* "ToCP": a table of contents */
    {1, 0, 0, 0},             /* format version */
    {0, 0, 0, 0},             /* data version */
    {0},  0,    0,    {{0, 0}}};
