//! The figure as a PNG: its SVG rasterised by resvg with the bundled fonts only
//! ([`super::fonts`]), at `--dpi` pixels per inch of its printed size, on white. Pure: SVG text
//! in, PNG bytes out.

use super::options::Dpi;

/// The most pixels a side: a 240 pt figure at 2400 dpi is 8000 wide; past this the image is
/// a mistake, and its buffer would be gigabytes.
const MAX_SIDE: u32 = 16_384;

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum PngError {
    #[error("the figure's SVG does not parse: {0}")]
    Svg(String),
    #[error("at {dpi} dpi the image would be {w}×{h} pixels, over {MAX_SIDE} a side: give a lower --dpi")]
    TooLarge { dpi: f64, w: u64, h: u64 },
    #[error("cannot encode the PNG: {0}")]
    Encode(String),
    #[error("{0}")]
    Font(String),
}

/// `svg` (whose size is in points, as the figure's is) drawn at `dpi`.
pub fn svg_to_png(svg: &str, dpi: Dpi) -> Result<Vec<u8>, PngError> {
    let pixmap = rasterise(svg, dpi)?;
    encode(&pixmap, dpi)
}

/// The pixels of `svg` at `dpi`, its width and height in points times dpi/72, rounded.
pub fn rasterise(svg: &str, dpi: Dpi) -> Result<resvg::tiny_skia::Pixmap, PngError> {
    let opt = resvg::usvg::Options {
        // One user unit per point: the figure's `width="240pt"` is then 240 units.
        dpi: 72.0,
        fontdb: std::sync::Arc::new(super::fonts::database().map_err(PngError::Font)?),
        ..Default::default()
    };
    let tree = resvg::usvg::Tree::from_str(svg, &opt).map_err(|e| PngError::Svg(e.to_string()))?;
    let size = tree.size();
    let (w, h) =
        (dpi.pixels(size.width() as f64).round(), dpi.pixels(size.height() as f64).round());
    let too_large = || PngError::TooLarge { dpi: dpi.get(), w: w as u64, h: h as u64 };
    if w > MAX_SIDE as f64 || h > MAX_SIDE as f64 {
        return Err(too_large());
    }
    let mut pixmap = resvg::tiny_skia::Pixmap::new(w as u32, h as u32).ok_or_else(too_large)?;
    pixmap.fill(resvg::tiny_skia::Color::WHITE);
    let (sx, sy) = (w as f32 / size.width(), h as f32 / size.height());
    resvg::render(&tree, resvg::tiny_skia::Transform::from_scale(sx, sy), &mut pixmap.as_mut());
    Ok(pixmap)
}

/// 8-bit RGB (the figure is opaque), with the resolution recorded (pHYs) so that a document
/// places the image at its printed size.
fn encode(pixmap: &resvg::tiny_skia::Pixmap, dpi: Dpi) -> Result<Vec<u8>, PngError> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, pixmap.width(), pixmap.height());
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let per_metre = (dpi.get() / 0.0254).round() as u32;
    enc.set_pixel_dims(Some(png::PixelDimensions {
        xppu: per_metre,
        yppu: per_metre,
        unit: png::Unit::Meter,
    }));
    let rgb: Vec<u8> = pixmap
        .pixels()
        .iter()
        .flat_map(|p| {
            let c = p.demultiply();
            [c.red(), c.green(), c.blue()]
        })
        .collect();
    let err = |e: png::EncodingError| PngError::Encode(e.to_string());
    let mut w = enc.write_header().map_err(err)?;
    w.write_image_data(&rgb).map_err(err)?;
    w.finish().map_err(err)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svg(w: f64, h: f64, body: &str) -> String {
        format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}pt" height="{h}pt" viewBox="0 0 {w} {h}">{body}</svg>"#
        )
    }

    fn decode(bytes: &[u8]) -> (png::OutputInfo, Vec<u8>, Option<png::PixelDimensions>) {
        let mut r = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
        let dims = r.info().pixel_dims;
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        (info, buf, dims)
    }

    #[test]
    fn the_image_is_the_points_times_dpi_over_72_and_records_its_dpi() {
        let bytes = svg_to_png(&svg(240.0, 36.0, ""), Dpi::PRINT).unwrap();
        let (info, px, dims) = decode(&bytes);
        assert_eq!((info.width, info.height), (1000, 150));
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert!(px.iter().all(|&b| b == 255), "white where nothing is drawn");
        assert_eq!(dims.unwrap().xppu, 11811, "300 dpi in pixels a metre");
    }

    /// Text in the bundled fonts is drawn: CJK and math ink the image; with no font at all
    /// usvg draws no text, so ink there is the fonts'.
    #[test]
    fn cjk_and_math_text_is_drawn_with_the_bundled_fonts() {
        let text = r##"<text x="4" y="14" font-family="'DejaVu Sans Mono'" font-size="12" fill="#000">你好 ≈ ∑ ≪</text>"##;
        let pix = rasterise(&svg(80.0, 20.0, text), Dpi::new(144.0).unwrap()).unwrap();
        let ink = pix.pixels().iter().filter(|p| p.red() < 128).count();
        assert!(ink > 200, "{ink} dark pixels");
    }

    #[test]
    fn an_absurd_resolution_is_refused_with_the_size_it_would_take() {
        let e = svg_to_png(&svg(1440.0, 2000.0, ""), Dpi::new(2400.0).unwrap()).unwrap_err();
        assert!(matches!(e, PngError::TooLarge { w: 48000, .. }), "{e}");
        assert!(e.to_string().contains("lower --dpi"));
    }
}
